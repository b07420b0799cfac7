import pytest

from agentloop.apps.base import ApiError
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.builtin.apps import music
from agentloop.apps.builtin.people import make_world_data


@pytest.fixture
def world():
    return BUILTIN.new_world(11, ["music"])


@pytest.fixture
def call(world):
    """Call a music API as the logged-in supervisor."""
    email = world.state["supervisor"]["profile"]["1"]["email"]
    password = world.state["supervisor"]["accounts"]["music"]["password"]
    token = world.call("music", "login", {"username": email, "password": password})["access_token"]
    return lambda api, **args: world.call("music", api, {"access_token": token, **args})


def all_pages(call, api, limit=7, **args):
    items, page = [], 0
    while batch := call(api, page_index=page, page_limit=limit, **args):
        assert len(batch) <= limit
        items.extend(batch)
        page += 1
    return items


def mine(world):
    me = world.state["supervisor"]["profile"]["1"]["email"]
    return sorted(
        (p for p in world.state["music"]["playlists"].values() if p["owner_email"] == me), key=lambda p: p["id"]
    )


def theirs(world):
    me = world.state["supervisor"]["profile"]["1"]["email"]
    return [p for p in world.state["music"]["playlists"].values() if p["owner_email"] != me]


def test_catalogue_is_deterministic_and_sized_like_a_small_streaming_library():
    data = make_world_data(5)
    a, b = music.build_state(data), music.build_state(make_world_data(5))
    assert a == b
    assert 150 <= len(a["songs"]) <= 260
    assert len({s["title"] for s in a["songs"].values()}) == len(a["songs"])  # titles are unique
    assert all(s["artist_id"] == a["albums"][str(s["album_id"])]["artist_id"] for s in a["songs"].values())


def test_apis_need_a_valid_token(world):
    with pytest.raises(ApiError) as exc:
        world.call("music", "list_playlists", {"access_token": "stale"})
    assert exc.value.status == 401 and "music.login" in exc.value.message
    with pytest.raises(ApiError) as exc:
        world.call("music", "list_playlists", {})
    assert exc.value.status == 422 and "access_token" in exc.value.message


def test_search_pages_do_not_overlap_and_end(world, call):
    songs = all_pages(call, "search_songs")
    ids = [s["song_id"] for s in songs]
    assert len(ids) == len(set(ids)) == len(world.state["music"]["songs"])
    plays = [world.state["music"]["songs"][str(i)]["play_count"] for i in ids]
    assert plays == sorted(plays, reverse=True)  # most popular first without a query


def test_search_filters_and_ranking(world, call):
    song = world.state["music"]["songs"]["7"]
    hits = call("search_songs", query=song["title"].upper())
    assert hits[0]["song_id"] == 7  # the exact title ranks first, case-insensitively
    for genre in ("jazz", "rock"):
        assert all(s["genre"] == genre for s in all_pages(call, "search_songs", genre=genre))
    artist = world.state["music"]["artists"][str(song["artist_id"])]["name"]
    by_artist = all_pages(call, "search_songs", artist=artist.lower())
    assert by_artist and all(s["artist_name"] == artist for s in by_artist)
    album = all_pages(call, "search_songs", album_id=song["album_id"])
    tracks = [world.state["music"]["songs"][str(s["song_id"])]["track_number"] for s in album]
    assert tracks == list(range(1, len(tracks) + 1))  # an album alone lists in track order
    newest = call("search_songs", sort_by="newest", page_limit=20)
    assert [s["release_year"] for s in newest] == sorted((s["release_year"] for s in newest), reverse=True)
    with pytest.raises(ApiError) as exc:
        call("search_songs", album_id=99999)
    assert exc.value.status == 404 and "album" in exc.value.message
    with pytest.raises(ApiError) as exc:
        call("search_songs", genre="polka")
    assert exc.value.status == 422


def test_artist_page_lists_albums_and_top_songs(world, call):
    artist = call("search_artists", query="", page_limit=1)[0]
    shown = call("show_artist", artist_id=artist["artist_id"])
    years = [a["release_year"] for a in shown["albums"]]
    assert years == sorted(years) and sum(a["track_count"] for a in shown["albums"]) >= len(shown["top_songs"])
    assert all(s["artist_id"] == artist["artist_id"] for s in shown["top_songs"])
    with pytest.raises(ApiError) as exc:
        call("show_artist", artist_id=4242)
    assert exc.value.status == 404


def test_like_and_unlike(world, call):
    liked = {like["song_id"] for like in world.state["music"]["likes"].values()}
    song_id = next(int(k) for k in world.state["music"]["songs"] if int(k) not in liked)
    assert call("show_song", song_id=song_id)["liked"] is False
    call("like_song", song_id=song_id)
    assert call("show_song", song_id=song_id)["liked"] is True
    assert call("list_liked_songs", page_limit=1)[0]["song_id"] == song_id  # newest like first
    with pytest.raises(ApiError) as exc:
        call("like_song", song_id=song_id)
    assert exc.value.status == 409
    call("unlike_song", song_id=song_id)
    with pytest.raises(ApiError) as exc:
        call("unlike_song", song_id=song_id)
    assert exc.value.status == 404 and "not among your liked songs" in exc.value.message
    assert len(all_pages(call, "list_liked_songs")) == len(liked)


def test_playlists_in_library_and_owned_only(world, call):
    everything = all_pages(call, "list_playlists", limit=4)
    own = all_pages(call, "list_playlists", limit=4, owned_only=True)
    assert len(everything) == len(mine(world)) + len(theirs(world))
    assert {p["playlist_id"] for p in own} == {p["id"] for p in mine(world)}
    shown = call("show_playlist", playlist_id=own[0]["playlist_id"])
    assert shown["song_count"] == len(shown["songs"]) == own[0]["song_count"]
    assert shown["total_duration_seconds"] == sum(s["duration_seconds"] for s in shown["songs"])
    assert [s["position"] for s in shown["songs"]] == list(range(1, len(shown["songs"]) + 1))


def test_create_rename_and_delete_playlist(world, call):
    taken = mine(world)[0]["name"]
    with pytest.raises(ApiError) as exc:
        call("create_playlist", name=taken.upper())
    assert exc.value.status == 409 and "playlist_id" in exc.value.message
    with pytest.raises(ApiError) as exc:
        call("create_playlist", name="New", song_ids=[1, 99999])
    assert exc.value.status == 404 and "search_songs" in exc.value.message
    pid = call("create_playlist", name="New", song_ids=[3, 1])["playlist_id"]
    record = world.state["music"]["playlists"][str(pid)]
    assert record["song_ids"] == [3, 1] and record["owner_email"] == world.state["supervisor"]["profile"]["1"]["email"]
    with pytest.raises(ApiError) as exc:
        call("rename_playlist", playlist_id=pid, name=taken)
    assert exc.value.status == 409
    call("rename_playlist", playlist_id=pid, name="Newer")
    assert record["name"] == "Newer"
    call("delete_playlist", playlist_id=pid)
    assert str(pid) not in world.state["music"]["playlists"]


def test_add_and_remove_songs(world, call):
    playlist = mine(world)[0]
    before = list(playlist["song_ids"])
    outside = [int(k) for k in world.state["music"]["songs"] if int(k) not in before][:2]
    with pytest.raises(ApiError) as exc:
        call("add_to_playlist", playlist_id=playlist["id"], song_ids=[outside[0], before[0]])
    assert exc.value.status == 409 and playlist["song_ids"] == before  # all or nothing
    call("add_to_playlist", playlist_id=playlist["id"], song_ids=[outside[0]])
    call("add_to_playlist", playlist_id=playlist["id"], song_ids=[outside[1]], position=1)
    assert playlist["song_ids"] == [outside[1], *before, outside[0]]
    with pytest.raises(ApiError) as exc:
        call("remove_from_playlist", playlist_id=playlist["id"], song_ids=[outside[0], 99999])
    assert exc.value.status == 404 and len(playlist["song_ids"]) == len(before) + 2
    call("remove_from_playlist", playlist_id=playlist["id"], song_ids=outside)
    assert playlist["song_ids"] == before


def test_someone_elses_playlist_cannot_be_changed(world, call):
    other = theirs(world)[0]
    for api, args in [
        ("add_to_playlist", {"song_ids": [1]}),
        ("rename_playlist", {"name": "Mine now"}),
        ("delete_playlist", {}),
    ]:
        with pytest.raises(ApiError) as exc:
            call(api, playlist_id=other["id"], **args)
        assert exc.value.status == 403 and other["owner_email"] in exc.value.message
    assert call("show_playlist", playlist_id=other["id"])["owner_email"] == other["owner_email"]


def test_music_scenarios_are_never_training_tasks_and_vary():
    tasks = [t for t in BUILTIN.tasks() if t.scenario_id.startswith("music_")]
    assert tasks and all(t.split != "train" for t in tasks)
    by_scenario: dict[str, set[str]] = {}
    for t in tasks:
        by_scenario.setdefault(t.scenario_id, set()).add(t.instruction)
    assert all(len(instructions) == 3 for instructions in by_scenario.values()), by_scenario
