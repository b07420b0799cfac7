"""Music: a streaming app with a song catalogue, the supervisor's playlists and liked songs."""

from __future__ import annotations

import random
from typing import Any

from agentloop.apps.base import (
    ApiError,
    AppSpec,
    AppState,
    CallContext,
    array,
    boolean,
    integer,
    page_params,
    paginate,
    string,
)
from agentloop.apps.builtin.people import WorldData, iso

GENRES = ("pop", "rock", "indie", "jazz", "hip hop", "electronic", "folk", "r&b", "country", "classical")
# (shortest, longest) track length in seconds, by genre
DURATIONS = {"classical": (240, 720), "jazz": (200, 480), "electronic": (190, 420)}
CATALOGUE_SIZE = 230  # songs, roughly: artists get no further albums once it is reached
COUNTRIES = (
    "United States",
    "United Kingdom",
    "Canada",
    "Australia",
    "Sweden",
    "Ireland",
    "Nigeria",
    "Japan",
    "France",
)

ADJECTIVES = (
    "Golden",
    "Silver",
    "Electric",
    "Quiet",
    "Broken",
    "Velvet",
    "Neon",
    "Paper",
    "Wild",
    "Hollow",
    "Crimson",
    "Lonely",
    "Midnight",
    "Northern",
    "Secret",
    "Falling",
    "Burning",
    "Gentle",
    "Restless",
    "Blue",
    "Distant",
    "Endless",
    "Sweet",
    "Heavy",
    "Little",
    "Hidden",
    "Fading",
    "Bright",
    "Cold",
    "Painted",
)
NOUNS = (
    "Heart",
    "River",
    "Highway",
    "Moon",
    "City",
    "Fire",
    "Ocean",
    "Garden",
    "Window",
    "Skyline",
    "Letter",
    "Shadow",
    "Mirror",
    "Train",
    "Dream",
    "Stranger",
    "Island",
    "Thunder",
    "Radio",
    "Diamond",
    "Horizon",
    "Satellite",
    "Ghost",
    "Harbor",
    "Feather",
    "Lantern",
    "Winter",
    "Storm",
    "Echo",
    "Signal",
    "Parade",
    "Canyon",
    "Wildfire",
    "Morning",
    "Avenue",
    "Compass",
)
TITLE_TEMPLATES = (
    "{a} {n}",
    "{a} {n}",
    "The {n}",
    "{n} Song",
    "Back to the {n}",
    "When the {n} Calls",
    "Under the {a} {n}",
    "Dancing in the {n}",
    "Chasing {n}s",
    "Another {a} {n}",
    "Me and the {n}",
    "Last {n} Home",
    "All the {a} {n}s",
    "{n} and {n2}",
    "Letters from the {n}",
)
ALBUM_TEMPLATES = (
    "{a} {n}s",
    "{n} Sessions",
    "The {a} Years",
    "{n}",
    "Songs for the {n}",
    "{a} Hours",
    "Live at the {n}",
)
SOLO_FIRST = (
    "Nina",
    "Theo",
    "Maya",
    "Jonah",
    "Lena",
    "Oscar",
    "Iris",
    "Felix",
    "Ruby",
    "Miles",
    "Clara",
    "Ezra",
    "Hazel",
    "Jude",
    "Stella",
    "Leo",
    "Amara",
    "Kofi",
)
SOLO_LAST = (
    "Park",
    "Vance",
    "Moreno",
    "Hale",
    "Okafor",
    "Lindqvist",
    "Reyes",
    "Sato",
    "Marlow",
    "Quinn",
    "Bishop",
    "Delgado",
    "Frost",
    "Kaur",
    "Novak",
    "Ellison",
)
MY_PLAYLISTS = (
    "Road trip",
    "Morning run",
    "Focus",
    "Dinner party",
    "Sunday chill",
    "Throwbacks",
    "Workout",
    "Rainy days",
    "Cooking",
    "Late night drive",
    "Summer 2024",
    "Study beats",
)
FRIEND_PLAYLISTS = ("party mix", "wedding favourites", "gym bangers", "jazz for dinner", "indie finds")


def _artist_names(rng: random.Random, count: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        kind = rng.random()
        if kind < 0.4:
            name = f"{rng.choice(SOLO_FIRST)} {rng.choice(SOLO_LAST)}"
        elif kind < 0.7:
            name = f"The {rng.choice(NOUNS)}s"
        else:
            name = f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
        if name not in names:
            names.append(name)
    return names


def _title(rng: random.Random, templates: tuple[str, ...], used: set[str]) -> str:
    while True:
        n, n2 = rng.sample(NOUNS, 2)
        title = rng.choice(templates).format(a=rng.choice(ADJECTIVES), n=n, n2=n2)
        if title not in used:
            used.add(title)
            return title


def build_state(data: WorldData) -> AppState:
    rng = data.rng("music")
    me = data.supervisor.email
    artists: dict[str, dict[str, Any]] = {}
    albums: dict[str, dict[str, Any]] = {}
    songs: dict[str, dict[str, Any]] = {}
    used_titles: set[str] = set()
    used_albums: set[str] = set()
    for aid, name in enumerate(_artist_names(rng, rng.randint(24, 27)), start=1):
        genre = rng.choice(GENRES)
        artists[str(aid)] = {
            "id": aid,
            "name": name,
            "genre": genre,
            "country": rng.choice(COUNTRIES),
            "monthly_listeners": rng.randint(2_000, 9_000_000),
        }
        year = rng.randint(1972, 2021)
        for n_album in range(rng.choice((1, 1, 2, 2, 2, 3))):
            if n_album and len(songs) > CATALOGUE_SIZE:
                break
            album_id = len(albums) + 1
            albums[str(album_id)] = {
                "id": album_id,
                "title": _title(rng, ALBUM_TEMPLATES, used_albums),
                "artist_id": aid,
                "release_year": year,
                "genre": genre,
            }
            shortest, longest = DURATIONS.get(genre, (140, 330))
            for track in range(1, rng.randint(3, 6) + 1):
                song_id = len(songs) + 1
                songs[str(song_id)] = {
                    "id": song_id,
                    "title": _title(rng, TITLE_TEMPLATES, used_titles),
                    "artist_id": aid,
                    "album_id": album_id,
                    "track_number": track,
                    "genre": genre,
                    "duration_seconds": rng.randint(shortest, longest),
                    "release_year": year,
                    "explicit": genre == "hip hop" and rng.random() < 0.6,
                    "play_count": rng.randint(1_000, 250_000_000),
                }
            year = min(2025, year + rng.randint(1, 4))

    song_ids = [int(k) for k in songs]
    playlists: dict[str, dict[str, Any]] = {}
    for name in rng.sample(MY_PLAYLISTS, rng.randint(8, 10)):
        created = data.ago(days=rng.randint(30, 900))
        pid = len(playlists) + 1
        playlists[str(pid)] = {
            "id": pid,
            "name": name,
            "description": "",
            "owner_email": me,
            "is_public": rng.random() < 0.4,
            "song_ids": rng.sample(song_ids, rng.randint(6, 24)),
            "created_at": created,
            "updated_at": data.ago(days=rng.randint(1, 29)),
        }
    for friend, label in zip(rng.sample(data.people, 3), rng.sample(FRIEND_PLAYLISTS, 3), strict=True):
        pid = len(playlists) + 1
        created = data.ago(days=rng.randint(30, 600))
        playlists[str(pid)] = {
            "id": pid,
            "name": f"{friend.first_name}'s {label}",
            "description": f"Made by {friend.name}.",
            "owner_email": friend.email,
            "is_public": True,
            "song_ids": rng.sample(song_ids, rng.randint(8, 20)),
            "created_at": created,
            "updated_at": created,
        }

    likes: dict[str, dict[str, Any]] = {}
    for i, sid in enumerate(rng.sample(song_ids, rng.randint(35, 50)), start=1):
        likes[str(i)] = {"id": i, "song_id": sid, "liked_at": data.ago(days=rng.uniform(0.5, 700))}
    return {
        "artists": artists,
        "albums": albums,
        "songs": songs,
        "playlists": playlists,
        "likes": likes,
        "_sessions": {},
    }


app = AppSpec(
    name="music",
    description="Stream music: search songs and artists, manage your playlists and liked songs.",
    build_state=build_state,
)

SONG = "{song_id, title, artist_id, artist_name, album_id, album_title, genre, duration_seconds, release_year}"
PLAYLIST_SUMMARY = "{playlist_id, name, owner_email, is_public, song_count, updated_at}"


def _song(ctx: CallContext, song: dict[str, Any]) -> dict[str, Any]:
    artist = ctx.table("artists")[str(song["artist_id"])]
    album = ctx.table("albums")[str(song["album_id"])]
    return {
        "song_id": song["id"],
        "title": song["title"],
        "artist_id": artist["id"],
        "artist_name": artist["name"],
        "album_id": album["id"],
        "album_title": album["title"],
        "genre": song["genre"],
        "duration_seconds": song["duration_seconds"],
        "release_year": song["release_year"],
    }


def _liked(ctx: CallContext) -> dict[int, dict[str, Any]]:
    return {like["song_id"]: like for like in ctx.table("likes").values()}


def _playlist_summary(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "playlist_id": p["id"],
        "name": p["name"],
        "owner_email": p["owner_email"],
        "is_public": p["is_public"],
        "song_count": len(p["song_ids"]),
        "updated_at": p["updated_at"],
    }


def _own_playlist(ctx: CallContext, playlist_id: int) -> dict[str, Any]:
    playlist = ctx.get("playlists", playlist_id, "playlist")
    if playlist["owner_email"] != ctx.user:
        raise ApiError(
            403,
            f"Playlist {playlist_id} ({playlist['name']!r}) belongs to {playlist['owner_email']}; you can only "
            "change your own playlists. Create your own playlist and add the songs to it instead.",
        )
    return playlist


def _check_songs(ctx: CallContext, song_ids: list[int]) -> None:
    missing = [s for s in song_ids if str(s) not in ctx.table("songs")]
    if missing:
        raise ApiError(404, f"No song with id {', '.join(map(str, missing))}. Find song ids with search_songs.")
    if len(set(song_ids)) != len(song_ids):
        raise ApiError(422, "song_ids lists the same song more than once.")


def _check_name_free(ctx: CallContext, name: str, except_id: int | None = None) -> None:
    for p in ctx.table("playlists").values():
        if p["owner_email"] == ctx.user and p["id"] != except_id and p["name"].casefold() == name.casefold():
            raise ApiError(409, f"You already have a playlist named {p['name']!r} (playlist_id {p['id']}).")


@app.api(
    "Search the song catalogue. `query` matches song titles, artist names and album titles; filter by artist "
    "name, album or genre. Results are ranked by relevance when there is a query, in track order when only "
    "an album is given, and by popularity otherwise, unless `sort_by` says otherwise.",
    params={
        "query": string("Words to look for (case-insensitive)."),
        "artist": string("Only songs by an artist whose name contains this text."),
        "album_id": integer("Only songs of this album."),
        "genre": string("Only songs of this genre.", enum=list(GENRES)),
        "sort_by": string(
            "Order of the results.", enum=["relevance", "popularity", "newest", "oldest", "duration", "title"]
        ),
        **page_params(),
    },
    returns=f"[{SONG}]",
)
def search_songs(
    ctx: CallContext,
    page_index: int,
    page_limit: int,
    query: str | None = None,
    artist: str | None = None,
    album_id: int | None = None,
    genre: str | None = None,
    sort_by: str | None = None,
) -> list[dict[str, Any]]:
    artists, albums = ctx.table("artists"), ctx.table("albums")
    if album_id is not None:
        ctx.get("albums", album_id, "album")
    q = (query or "").casefold().strip()
    rows = []
    for s in ctx.table("songs").values():
        artist_name = artists[str(s["artist_id"])]["name"].casefold()
        if artist and artist.casefold().strip() not in artist_name:
            continue
        if (album_id is not None and s["album_id"] != album_id) or (genre and s["genre"] != genre):
            continue
        album_title = albums[str(s["album_id"])]["title"].casefold()
        if q and q not in s["title"].casefold() and q not in artist_name and q not in album_title:
            continue
        rows.append(s)
    order = sort_by or ("relevance" if q else "album_order" if album_id is not None else "popularity")
    keys = {
        "relevance": lambda s: (s["title"].casefold() != q, q not in s["title"].casefold(), -s["play_count"]),
        "album_order": lambda s: s["track_number"],
        "popularity": lambda s: -s["play_count"],
        "newest": lambda s: (-s["release_year"], s["title"]),
        "oldest": lambda s: (s["release_year"], s["title"]),
        "duration": lambda s: (-s["duration_seconds"], s["title"]),
        "title": lambda s: s["title"].casefold(),
    }
    rows.sort(key=keys[order])
    return [_song(ctx, s) for s in paginate(rows, page_index, page_limit)]


@app.api(
    "Show one song: its details, its track number on the album, how often it was played and whether you like it.",
    params={"song_id": integer("Id of the song.")},
    required=["song_id"],
    returns=SONG[:-1] + ", track_number, explicit, play_count, liked}",
)
def show_song(ctx: CallContext, song_id: int) -> dict[str, Any]:
    song = ctx.get("songs", song_id, "song")
    return {
        **_song(ctx, song),
        "track_number": song["track_number"],
        "explicit": song["explicit"],
        "play_count": song["play_count"],
        "liked": song_id in _liked(ctx),
    }


@app.api(
    "Search artists by name, optionally only those of a genre; most listened first.",
    params={
        "query": string("Part of the artist's name (case-insensitive)."),
        "genre": string("Only artists of this genre.", enum=list(GENRES)),
        **page_params(),
    },
    returns="[{artist_id, name, genre, country, monthly_listeners}]",
)
def search_artists(
    ctx: CallContext, page_index: int, page_limit: int, query: str | None = None, genre: str | None = None
) -> list[dict[str, Any]]:
    q = (query or "").casefold().strip()
    rows = [
        a for a in ctx.table("artists").values() if q in a["name"].casefold() and (genre is None or a["genre"] == genre)
    ]
    rows.sort(key=lambda a: -a["monthly_listeners"])
    return [
        {"artist_id": a["id"], **{k: v for k, v in a.items() if k != "id"}}
        for a in paginate(rows, page_index, page_limit)
    ]


@app.api(
    "Show an artist with their albums (oldest first) and their five most played songs.",
    params={"artist_id": integer("Id of the artist.")},
    required=["artist_id"],
    returns="{artist_id, name, genre, country, monthly_listeners, albums: [{album_id, title, release_year, "
    "track_count}], top_songs: [" + SONG + "]}",
)
def show_artist(ctx: CallContext, artist_id: int) -> dict[str, Any]:
    artist = ctx.get("artists", artist_id, "artist")
    songs = [s for s in ctx.table("songs").values() if s["artist_id"] == artist_id]
    albums = sorted(
        (a for a in ctx.table("albums").values() if a["artist_id"] == artist_id),
        key=lambda a: (a["release_year"], a["id"]),
    )
    top = sorted(songs, key=lambda s: -s["play_count"])[:5]
    return {
        "artist_id": artist["id"],
        **{k: v for k, v in artist.items() if k != "id"},
        "albums": [
            {
                "album_id": a["id"],
                "title": a["title"],
                "release_year": a["release_year"],
                "track_count": sum(s["album_id"] == a["id"] for s in songs),
            }
            for a in albums
        ],
        "top_songs": [_song(ctx, s) for s in top],
    }


@app.api(
    "List the playlists in your library: yours and the ones you follow, most recently updated first.",
    params={
        "owned_only": boolean("Only playlists you created (not the ones you follow)."),
        **page_params(),
    },
    returns=f"[{PLAYLIST_SUMMARY}]",
)
def list_playlists(
    ctx: CallContext, page_index: int, page_limit: int, owned_only: bool = False
) -> list[dict[str, Any]]:
    rows = [p for p in ctx.table("playlists").values() if not owned_only or p["owner_email"] == ctx.user]
    rows.sort(key=lambda p: (p["updated_at"], p["id"]), reverse=True)
    return [_playlist_summary(p) for p in paginate(rows, page_index, page_limit)]


@app.api(
    "Show a playlist with all its songs, in playlist order.",
    params={"playlist_id": integer("Id of the playlist.")},
    required=["playlist_id"],
    returns="{playlist_id, name, description, owner_email, is_public, created_at, updated_at, song_count, "
    "total_duration_seconds, songs: [{position, " + SONG[1:] + "]}",
)
def show_playlist(ctx: CallContext, playlist_id: int) -> dict[str, Any]:
    playlist = ctx.get("playlists", playlist_id, "playlist")
    songs = [ctx.table("songs")[str(sid)] for sid in playlist["song_ids"]]
    return {
        "playlist_id": playlist["id"],
        **{k: v for k, v in playlist.items() if k not in ("id", "song_ids")},
        "song_count": len(songs),
        "total_duration_seconds": sum(s["duration_seconds"] for s in songs),
        "songs": [{"position": i, **_song(ctx, s)} for i, s in enumerate(songs, start=1)],
    }


@app.api(
    "Create a playlist of your own, optionally with its first songs. Names must differ from your other playlists.",
    params={
        "name": string("Name of the playlist.", minLength=1),
        "description": string("A description."),
        "is_public": boolean("Whether others can find and follow it (default false)."),
        "song_ids": array("Songs to put in it, in order.", {"type": "integer"}),
    },
    required=["name"],
    returns="{playlist_id}",
)
def create_playlist(
    ctx: CallContext, name: str, description: str = "", is_public: bool = False, song_ids: list[int] | None = None
) -> dict[str, Any]:
    name = name.strip()
    _check_name_free(ctx, name)
    _check_songs(ctx, list(song_ids or []))
    now = iso(ctx.now)
    playlist = ctx.insert(
        "playlists",
        {
            "name": name,
            "description": description,
            "owner_email": ctx.user,
            "is_public": is_public,
            "song_ids": list(song_ids or []),
            "created_at": now,
            "updated_at": now,
        },
    )
    return {"playlist_id": playlist["id"]}


@app.api(
    "Rename one of your playlists.",
    params={"playlist_id": integer("Id of the playlist."), "name": string("The new name.", minLength=1)},
    required=["playlist_id", "name"],
    returns="{playlist_id, name}",
)
def rename_playlist(ctx: CallContext, playlist_id: int, name: str) -> dict[str, Any]:
    playlist = _own_playlist(ctx, playlist_id)
    name = name.strip()
    _check_name_free(ctx, name, except_id=playlist_id)
    playlist["name"] = name
    playlist["updated_at"] = iso(ctx.now)
    return {"playlist_id": playlist_id, "name": name}


@app.api(
    "Add songs to the end of one of your playlists (or at `position`, 1 = first). A playlist holds each song once.",
    params={
        "playlist_id": integer("Id of the playlist."),
        "song_ids": array("Songs to add, in order.", {"type": "integer"}, minItems=1),
        "position": integer("Where to insert them (1 = first); default: at the end.", minimum=1),
    },
    required=["playlist_id", "song_ids"],
    returns="{playlist_id, song_count}",
)
def add_to_playlist(
    ctx: CallContext, playlist_id: int, song_ids: list[int], position: int | None = None
) -> dict[str, Any]:
    playlist = _own_playlist(ctx, playlist_id)
    _check_songs(ctx, song_ids)
    already = [s for s in song_ids if s in playlist["song_ids"]]
    if already:
        raise ApiError(
            409,
            f"Song {', '.join(map(str, already))} is already in playlist {playlist['name']!r}; nothing was added.",
        )
    at = len(playlist["song_ids"]) if position is None else min(position - 1, len(playlist["song_ids"]))
    playlist["song_ids"][at:at] = song_ids
    playlist["updated_at"] = iso(ctx.now)
    return {"playlist_id": playlist_id, "song_count": len(playlist["song_ids"])}


@app.api(
    "Remove songs from one of your playlists.",
    params={
        "playlist_id": integer("Id of the playlist."),
        "song_ids": array("Songs to remove.", {"type": "integer"}, minItems=1),
    },
    required=["playlist_id", "song_ids"],
    returns="{playlist_id, song_count}",
)
def remove_from_playlist(ctx: CallContext, playlist_id: int, song_ids: list[int]) -> dict[str, Any]:
    playlist = _own_playlist(ctx, playlist_id)
    absent = [s for s in song_ids if s not in playlist["song_ids"]]
    if absent:
        raise ApiError(
            404,
            f"Song {', '.join(map(str, absent))} is not in playlist {playlist['name']!r}; nothing was removed. "
            "See its songs with show_playlist.",
        )
    playlist["song_ids"] = [s for s in playlist["song_ids"] if s not in song_ids]
    playlist["updated_at"] = iso(ctx.now)
    return {"playlist_id": playlist_id, "song_count": len(playlist["song_ids"])}


@app.api(
    "Delete one of your playlists for good (the songs stay in the catalogue).",
    params={"playlist_id": integer("Id of the playlist.")},
    required=["playlist_id"],
    returns="A confirmation message.",
)
def delete_playlist(ctx: CallContext, playlist_id: int) -> str:
    playlist = _own_playlist(ctx, playlist_id)
    del ctx.table("playlists")[str(playlist_id)]
    return f"Playlist {playlist['name']!r} deleted."


@app.api(
    "Add a song to your liked songs.",
    params={"song_id": integer("Id of the song.")},
    required=["song_id"],
    returns="{song_id, liked_at}",
)
def like_song(ctx: CallContext, song_id: int) -> dict[str, Any]:
    song = ctx.get("songs", song_id, "song")
    if song_id in _liked(ctx):
        raise ApiError(409, f"You already like {song['title']!r} (song {song_id}).")
    like = ctx.insert("likes", {"song_id": song_id, "liked_at": iso(ctx.now)})
    return {"song_id": song_id, "liked_at": like["liked_at"]}


@app.api(
    "Remove a song from your liked songs.",
    params={"song_id": integer("Id of the song.")},
    required=["song_id"],
    returns="A confirmation message.",
)
def unlike_song(ctx: CallContext, song_id: int) -> str:
    song = ctx.get("songs", song_id, "song")
    like = _liked(ctx).get(song_id)
    if like is None:
        raise ApiError(404, f"{song['title']!r} (song {song_id}) is not among your liked songs.")
    del ctx.table("likes")[str(like["id"])]
    return f"Removed {song['title']!r} from your liked songs."


@app.api(
    "List your liked songs, most recently liked first.",
    params={"genre": string("Only songs of this genre.", enum=list(GENRES)), **page_params()},
    returns=f"[{SONG[:-1]}, liked_at}}]",
)
def list_liked_songs(
    ctx: CallContext, page_index: int, page_limit: int, genre: str | None = None
) -> list[dict[str, Any]]:
    songs = ctx.table("songs")
    likes = [
        like for like in ctx.table("likes").values() if genre is None or songs[str(like["song_id"])]["genre"] == genre
    ]
    likes.sort(key=lambda like: (like["liked_at"], like["id"]), reverse=True)
    return [
        {**_song(ctx, songs[str(like["song_id"])]), "liked_at": like["liked_at"]}
        for like in paginate(likes, page_index, page_limit)
    ]
