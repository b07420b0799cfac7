"""Scenarios on the music app, alone and with notes or files."""

from __future__ import annotations

import random
from typing import Any

from agentloop.apps.builtin.scenarios.common import days_ago, my_email, plant
from agentloop.apps.builtin.scenarios.notes import find_note
from agentloop.apps.evaluation import added, normalise_text, removed, same_items, updated
from agentloop.apps.tasks import OracleClient, Scenario, TaskInstance
from agentloop.apps.world import World

NEW_PLAYLIST_NAMES = ("Weekend mix", "Kitchen dance party", "Long walks", "Fresh finds", "Night owls", "Sunday brunch")
OCCASIONS = ("Wedding", "Housewarming", "Birthday party", "Road trip with Sam", "Book club evening")


# --- reading the world at setup time --------------------------------------------------------------


def songs(world: World) -> list[dict[str, Any]]:
    return sorted(world.state["music"]["songs"].values(), key=lambda s: s["id"])


def artist_name(world: World, song: dict[str, Any]) -> str:
    return str(world.state["music"]["artists"][str(song["artist_id"])]["name"])


def own_playlists(world: World) -> list[dict[str, Any]]:
    me = my_email(world)
    rows = world.state["music"]["playlists"].values()
    return sorted((p for p in rows if p["owner_email"] == me), key=lambda p: p["id"])


def liked_ids(world: World) -> set[int]:
    return {like["song_id"] for like in world.state["music"]["likes"].values()}


def songs_by_artist(world: World) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for s in songs(world):
        out.setdefault(s["artist_id"], []).append(s)
    return out


def new_playlist_name(world: World, rng: random.Random) -> str:
    taken = {p["name"].casefold() for p in own_playlists(world)}
    return rng.choice([n for n in NEW_PLAYLIST_NAMES if n.casefold() not in taken])


def put_artist_in_playlist(world: World, rng: random.Random, playlist: dict[str, Any], count: int) -> int:
    """Make sure `count` songs of one artist are in the playlist (planting some); returns the artist id."""
    by_artist = songs_by_artist(world)
    artist_id = rng.choice(sorted(a for a, rows in by_artist.items() if len(rows) >= count))
    present = [s["id"] for s in by_artist[artist_id] if s["id"] in playlist["song_ids"]]
    missing = [s["id"] for s in by_artist[artist_id] if s["id"] not in playlist["song_ids"]]
    for sid in rng.sample(missing, max(0, count - len(present))):
        playlist["song_ids"].insert(rng.randint(0, len(playlist["song_ids"])), sid)
    return artist_id


# --- what a careful agent does -----------------------------------------------------------------------


def find_song(c: OracleClient, token: str, title: str, artist: str) -> dict[str, Any]:
    for song in c.pages("music", "search_songs", access_token=token, query=title):
        if song["title"] == title and song["artist_name"] == artist:
            return dict(song)
    raise LookupError(f"no song {title!r} by {artist}")


def find_playlist(c: OracleClient, token: str, name: str) -> dict[str, Any]:
    playlist = next(
        p for p in c.pages("music", "list_playlists", access_token=token, owned_only=True) if p["name"] == name
    )
    return dict(c.call("music", "show_playlist", access_token=token, playlist_id=playlist["playlist_id"]))


def liked_song_ids(c: OracleClient, token: str) -> set[int]:
    return {s["song_id"] for s in c.pages("music", "list_liked_songs", access_token=token)}


# --- scenarios -------------------------------------------------------------------------------------


def music_song_length(world: World, rng: random.Random) -> TaskInstance:
    song = rng.choice(songs(world))
    title, artist = song["title"], artist_name(world, song)

    def oracle(c: OracleClient) -> int:
        token = c.login("music")
        return int(find_song(c, token, title, artist)["duration_seconds"])

    return TaskInstance(
        f"How long is the song '{title}' by {artist}? Answer in seconds.", oracle, answer=song["duration_seconds"]
    )


def music_like_song(world: World, rng: random.Random) -> TaskInstance:
    liked = liked_ids(world)
    song = rng.choice([s for s in songs(world) if s["id"] not in liked])
    title, artist = song["title"], artist_name(world, song)

    def oracle(c: OracleClient) -> None:
        token = c.login("music")
        found = find_song(c, token, title, artist)
        c.call("music", "like_song", access_token=token, song_id=found["song_id"])

    phrasing = rng.choice(["Like the song '{t}' by {a} for me.", "Please add '{t}' by {a} to my liked songs."])
    return TaskInstance(phrasing.format(t=title, a=artist), oracle, [added("music", "likes", song_id=song["id"])])


def music_playlist_size(world: World, rng: random.Random) -> TaskInstance:
    playlist = rng.choice(own_playlists(world))
    name = playlist["name"]

    def oracle(c: OracleClient) -> int:
        token = c.login("music")
        mine = c.pages("music", "list_playlists", access_token=token, owned_only=True)
        return int(next(p for p in mine if p["name"] == name)["song_count"])

    phrasing = rng.choice(
        ["How many songs are in my '{n}' playlist?", "Count the songs in my music playlist '{n}' for me."]
    )
    return TaskInstance(phrasing.format(n=name), oracle, answer=len(playlist["song_ids"]))


def music_rename_playlist(world: World, rng: random.Random) -> TaskInstance:
    playlist = rng.choice(own_playlists(world))
    old, new = playlist["name"], new_playlist_name(world, rng)

    def oracle(c: OracleClient) -> None:
        token = c.login("music")
        found = find_playlist(c, token, old)
        c.call("music", "rename_playlist", access_token=token, playlist_id=found["playlist_id"], name=new)

    return TaskInstance(
        f"Rename my music playlist '{old}' to '{new}'.",
        oracle,
        [updated("music", "playlists", playlist["id"], name=new)],
    )


def music_new_playlist_two_songs(world: World, rng: random.Random) -> TaskInstance:
    first, second = rng.sample(songs(world), 2)
    picks = [(s["title"], artist_name(world, s)) for s in (first, second)]
    name = new_playlist_name(world, rng)

    def oracle(c: OracleClient) -> None:
        token = c.login("music")
        ids = [find_song(c, token, title, artist)["song_id"] for title, artist in picks]
        c.call("music", "create_playlist", access_token=token, name=name, song_ids=ids)

    return TaskInstance(
        f"Make a new playlist called '{name}' with two songs: '{picks[0][0]}' by {picks[0][1]} and "
        f"'{picks[1][0]}' by {picks[1][1]}.",
        oracle,
        [
            added(
                "music",
                "playlists",
                name=name,
                owner_email=my_email(world),
                song_ids=same_items([first["id"], second["id"]]),
            )
        ],
    )


def music_remove_artist_from_playlist(world: World, rng: random.Random) -> TaskInstance:
    playlist = rng.choice(own_playlists(world))
    artist_id = put_artist_in_playlist(world, rng, playlist, rng.randint(2, 3))
    artist = world.state["music"]["artists"][str(artist_id)]["name"]
    catalogue = world.state["music"]["songs"]
    keep = [sid for sid in playlist["song_ids"] if catalogue[str(sid)]["artist_id"] != artist_id]
    name = playlist["name"]

    def oracle(c: OracleClient) -> None:
        token = c.login("music")
        found = find_playlist(c, token, name)
        ids = [s["song_id"] for s in found["songs"] if s["artist_name"] == artist]
        c.call("music", "remove_from_playlist", access_token=token, playlist_id=found["playlist_id"], song_ids=ids)

    return TaskInstance(
        f"Take every song by {artist} out of my '{name}' playlist.",
        oracle,
        [updated("music", "playlists", playlist["id"], song_ids=keep)],
    )


def music_like_artist_from_playlist(world: World, rng: random.Random) -> TaskInstance:
    playlist = rng.choice(own_playlists(world))
    artist_id = put_artist_in_playlist(world, rng, playlist, 3)
    catalogue = world.state["music"]["songs"]
    theirs = [sid for sid in playlist["song_ids"] if catalogue[str(sid)]["artist_id"] == artist_id]
    # exactly one of them is liked already, and liking it again is an error a careful agent avoids
    likes = world.state["music"]["likes"]
    for key in [k for k, like in likes.items() if like["song_id"] in theirs]:
        del likes[key]
    plant(world, "music", "likes", {"song_id": rng.choice(theirs), "liked_at": days_ago(world, 40)})
    liked = liked_ids(world)
    artist, name = world.state["music"]["artists"][str(artist_id)]["name"], playlist["name"]
    to_like = [sid for sid in theirs if sid not in liked]

    def oracle(c: OracleClient) -> None:
        token = c.login("music")
        found = find_playlist(c, token, name)
        already = liked_song_ids(c, token)
        for s in found["songs"]:
            if s["artist_name"] == artist and s["song_id"] not in already:
                c.call("music", "like_song", access_token=token, song_id=s["song_id"])

    return TaskInstance(
        f"Add every song from my '{name}' playlist that is by {artist} to my liked songs.",
        oracle,
        [added("music", "likes", song_id=sid) for sid in to_like],
    )


def music_old_songs_duration(world: World, rng: random.Random) -> TaskInstance:
    catalogue = world.state["music"]["songs"]
    candidates = []
    for p in own_playlists(world):
        years = sorted({catalogue[str(sid)]["release_year"] for sid in p["song_ids"]})
        if len(years) >= 3:
            candidates.append((p, years))
    playlist, years = rng.choice(candidates)
    cutoff = rng.choice(years[1:-1] or years[1:])
    total = sum(
        catalogue[str(sid)]["duration_seconds"]
        for sid in playlist["song_ids"]
        if catalogue[str(sid)]["release_year"] < cutoff
    )
    name = playlist["name"]

    def oracle(c: OracleClient) -> int:
        token = c.login("music")
        found = find_playlist(c, token, name)
        return sum(s["duration_seconds"] for s in found["songs"] if s["release_year"] < cutoff)

    return TaskInstance(
        f"In my '{name}' playlist, what is the total length of the songs released before {cutoff}? "
        "Give the answer in seconds.",
        oracle,
        answer=total,
    )


def music_unlike_before_year(world: World, rng: random.Random) -> TaskInstance:
    catalogue = world.state["music"]["songs"]
    likes = sorted(world.state["music"]["likes"].values(), key=lambda like: like["id"])
    years = sorted(catalogue[str(like["song_id"])]["release_year"] for like in likes)
    cutoff = years[rng.randint(3, 7)] + 1  # a handful of songs, never all of them
    gone = [like for like in likes if catalogue[str(like["song_id"])]["release_year"] < cutoff]

    def oracle(c: OracleClient) -> None:
        token = c.login("music")
        old = [s for s in c.pages("music", "list_liked_songs", access_token=token) if s["release_year"] < cutoff]
        for s in old:
            c.call("music", "unlike_song", access_token=token, song_id=s["song_id"])

    phrasing = rng.choice(
        [
            "Clean up my liked songs: unlike every liked song that was released before {y}.",
            "Remove all songs released before {y} from my liked songs on music.",
            "I only want newer music in my likes: unlike every liked song from before {y}.",
        ]
    )
    return TaskInstance(
        phrasing.format(y=cutoff),
        oracle,
        [removed("music", "likes", like["id"]) for like in gone],
    )


def music_album_playlist(world: World, rng: random.Random) -> TaskInstance:
    catalogue = songs(world)
    taken = {p["name"].casefold() for p in own_playlists(world)}
    albums = [
        a
        for a in world.state["music"]["albums"].values()
        if sum(s["album_id"] == a["id"] for s in catalogue) >= 3 and a["title"].casefold() not in taken
    ]
    album = rng.choice(sorted(albums, key=lambda a: a["id"]))
    artist = world.state["music"]["artists"][str(album["artist_id"])]["name"]
    tracks = sorted((s for s in catalogue if s["album_id"] == album["id"]), key=lambda s: s["track_number"])
    title = album["title"]

    def oracle(c: OracleClient) -> None:
        token = c.login("music")
        found = next(
            a for a in c.pages("music", "search_artists", access_token=token, query=artist) if a["name"] == artist
        )
        info = c.call("music", "show_artist", access_token=token, artist_id=found["artist_id"])
        album_id = next(a["album_id"] for a in info["albums"] if a["title"] == title)
        ids = [s["song_id"] for s in c.pages("music", "search_songs", access_token=token, album_id=album_id)]
        c.call("music", "create_playlist", access_token=token, name=title, song_ids=ids)

    return TaskInstance(
        f"Create a playlist named '{title}' containing every song of the album '{title}' by {artist}, in the "
        "album's track order.",
        oracle,
        [added("music", "playlists", name=title, owner_email=my_email(world), song_ids=[s["id"] for s in tracks])],
    )


def music_playlist_from_note(world: World, rng: random.Random) -> TaskInstance:
    catalogue = songs(world)
    picks = rng.sample(catalogue, rng.randint(4, 5))
    # a cover: another artist has a song with the same title as one on the list, and it is more popular
    original = picks[rng.randrange(len(picks))]
    other_album = rng.choice(
        sorted(
            (a for a in world.state["music"]["albums"].values() if a["artist_id"] != original["artist_id"]),
            key=lambda a: a["id"],
        )
    )
    tracks = [s for s in catalogue if s["album_id"] == other_album["id"]]
    plant(
        world,
        "music",
        "songs",
        {
            **{k: v for k, v in original.items() if k != "id"},
            "artist_id": other_album["artist_id"],
            "album_id": other_album["id"],
            "track_number": len(tracks) + 1,
            "genre": other_album["genre"],
            "release_year": other_album["release_year"],
            "play_count": original["play_count"] * 3,
        },
    )
    occasion = rng.choice(OCCASIONS)
    note_title = f"{occasion} songs"
    lines = [(s["title"], artist_name(world, s)) for s in picks]
    created = days_ago(world, rng.randint(2, 20))
    plant(
        world,
        "notes",
        "notes",
        {
            "title": note_title,
            "body": "\n".join(f"{t} - {a}" for t, a in lines),
            "tags": ["music"],
            "pinned": False,
            "created_at": created,
            "updated_at": created,
        },
    )
    name = occasion

    def oracle(c: OracleClient) -> None:
        ntoken = c.login("notes")
        note = find_note(c, ntoken, note_title)
        body = c.call("notes", "show_note", access_token=ntoken, note_id=note["note_id"])["body"]
        mtoken = c.login("music")
        ids = []
        for line in body.splitlines():
            title, artist = line.rsplit(" - ", 1)
            ids.append(find_song(c, mtoken, title, artist)["song_id"])
        c.call("music", "create_playlist", access_token=mtoken, name=name, song_ids=ids)

    return TaskInstance(
        f"My note '{note_title}' lists songs as 'title - artist'. Create a music playlist called '{name}' with "
        "exactly those songs, in the same order as the note.",
        oracle,
        [added("music", "playlists", name=name, owner_email=my_email(world), song_ids=[s["id"] for s in picks])],
    )


def tracklist_matches(expected: list[str]) -> Any:
    """Field matcher: a text whose non-empty lines are `expected`, in order (spacing and case aside)."""
    want = [normalise_text(line) for line in expected]

    def check(value: Any) -> bool:
        if not isinstance(value, str):
            return False
        got = [normalise_text(line) for line in value.splitlines() if line.strip()]
        return got == want

    return check


def music_export_playlist_file(world: World, rng: random.Random) -> TaskInstance:
    playlist = rng.choice(own_playlists(world))
    name = playlist["name"]
    catalogue = world.state["music"]["songs"]
    lines = [
        f"{catalogue[str(sid)]['title']} - {artist_name(world, catalogue[str(sid)])}" for sid in playlist["song_ids"]
    ]
    path = rng.choice(["/Documents/{n} tracklist.txt", "/Notes/{n} songs.txt", "/Documents/Playlist - {n}.txt"])
    path = path.format(n=name)

    def oracle(c: OracleClient) -> None:
        mtoken = c.login("music")
        found = find_playlist(c, mtoken, name)
        text = "\n".join(f"{s['title']} - {s['artist_name']}" for s in found["songs"])
        ftoken = c.login("files")
        c.call("files", "write_file", access_token=ftoken, path=path, content=text)

    return TaskInstance(
        f"Save the track list of my music playlist '{name}' to a new text file {path}: one line per song, "
        "written 'Title - Artist', in playlist order.",
        oracle,
        [added("files", "files", path=path, kind="file", content=tracklist_matches(lines))],
    )


SCENARIOS = [
    Scenario("music_song_length", 1, ("music",), "test_challenge", music_song_length),
    Scenario("music_like_song", 1, ("music",), "dev", music_like_song),
    Scenario("music_playlist_size", 1, ("music",), "test_challenge", music_playlist_size),
    Scenario("music_rename_playlist", 1, ("music",), "test_normal", music_rename_playlist),
    Scenario("music_new_playlist_two_songs", 1, ("music",), "test_challenge", music_new_playlist_two_songs),
    Scenario("music_remove_artist_from_playlist", 2, ("music",), "test_challenge", music_remove_artist_from_playlist),
    Scenario("music_like_artist_from_playlist", 2, ("music",), "test_challenge", music_like_artist_from_playlist),
    Scenario("music_old_songs_duration", 2, ("music",), "test_challenge", music_old_songs_duration),
    Scenario("music_unlike_before_year", 2, ("music",), "test_challenge", music_unlike_before_year),
    Scenario("music_album_playlist", 2, ("music",), "test_challenge", music_album_playlist),
    Scenario("music_playlist_from_note", 3, ("notes", "music"), "dev", music_playlist_from_note),
    Scenario("music_export_playlist_file", 3, ("music", "files"), "test_challenge", music_export_playlist_file),
]
