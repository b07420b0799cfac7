import pytest

from agentloop.apps.base import ApiError
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.builtin.people import make_world_data
from agentloop.apps.evaluation import diff_states


@pytest.fixture
def world():
    return BUILTIN.new_world(11, ["mail"])


@pytest.fixture
def me(world):
    return world.state["supervisor"]["profile"]["1"]["email"]


@pytest.fixture
def call(world, me):
    password = world.state["supervisor"]["accounts"]["mail"]["password"]
    token = world.call("mail", "login", {"username": me, "password": password})["access_token"]

    def call(api, **args):
        return world.call("mail", api, {"access_token": token, **args})

    return call


def emails(world):
    return world.state["mail"]["emails"]


def everything(call, api, **args):
    out, page = [], 0
    while batch := call(api, page_index=page, page_limit=9, **args):
        out.extend(batch)
        page += 1
    return out


def a_thread_email(world, me):
    """An inbox email from a person, with someone else on it, so reply-all has people to add."""
    return next(e for e in emails(world).values() if e["folder"] == "inbox" and e["cc"] and e["sender"] != me)


def test_mailbox_is_realistic_and_about_the_worlds_people():
    data = make_world_data(11)
    rows = BUILTIN.new_world(11, ["mail"]).state["mail"]["emails"].values()
    assert 60 <= len(rows) <= 120
    assert {e["folder"] for e in rows} == {"inbox", "sent", "drafts", "trash"}
    people = {p.email for p in data.people}
    assert len({e["sender"] for e in rows} & people) >= 10
    assert any(e["attachments"] for e in rows) and any(e["labels"] for e in rows)
    assert all(e["date"] <= "2025-06-02T09:00:00Z" for e in rows)


def test_login_is_required(world):
    with pytest.raises(ApiError) as exc:
        world.call("mail", "list_inbox", {})
    assert exc.value.status == 422 and "access_token" in exc.value.message
    with pytest.raises(ApiError) as exc:
        world.call("mail", "list_inbox", {"access_token": "guess"})
    assert exc.value.status == 401


def test_inbox_pages_are_newest_first_without_overlap_and_end(world, call):
    listed = everything(call, "list_inbox")
    inbox = [e for e in emails(world).values() if e["folder"] == "inbox"]
    assert sorted(e["email_id"] for e in listed) == sorted(e["id"] for e in inbox)
    dates = [e["date"] for e in listed]
    assert dates == sorted(dates, reverse=True)
    assert "body" not in listed[0] and isinstance(listed[0]["attachments"], list)


def test_inbox_filters(world, call):
    unread = everything(call, "list_inbox", unread=True)
    assert unread and all(not e["read"] for e in unread)
    assert len(unread) + len(everything(call, "list_inbox", unread=False)) == len(everything(call, "list_inbox"))
    work = everything(call, "list_inbox", label="work")
    assert work and all("Work" in e["labels"] for e in work)
    assert {e["folder"] for e in everything(call, "list_sent")} == {"sent"}


def test_search_matches_every_word_attachments_and_skips_trash(world, call):
    with_file = next(e for e in emails(world).values() if e["attachments"] and e["folder"] == "inbox")
    file_name = with_file["attachments"][0]["file_name"]
    assert [e["email_id"] for e in call("search_emails", query=file_name)] == [with_file["id"]]
    assert call("search_emails", query=f"{with_file['subject']} zebra-unicorn") == []
    trashed = next(e for e in emails(world).values() if e["folder"] == "trash")
    assert trashed["id"] not in {e["email_id"] for e in everything(call, "search_emails", query=trashed["subject"])}
    assert trashed["id"] in {e["email_id"] for e in call("search_emails", query=trashed["subject"], folder="trash")}


def test_search_by_sender_and_dates(world, call):
    email = next(e for e in emails(world).values() if e["folder"] == "inbox" and e["sender_name"] != e["sender"])
    by_name = everything(call, "search_emails", sender=email["sender_name"].upper())
    assert email["id"] in {e["email_id"] for e in by_name} and all(e["sender"] == email["sender"] for e in by_name)
    day = email["date"][:10]
    on_or_after = everything(call, "search_emails", after=day)
    before = everything(call, "search_emails", before=day)
    assert email["id"] in {e["email_id"] for e in on_or_after}
    assert email["id"] not in {e["email_id"] for e in before}
    assert all(e["date"] >= day for e in on_or_after) and all(e["date"] < day for e in before)
    with pytest.raises(ApiError) as exc:
        call("search_emails", after="last tuesday")
    assert exc.value.status == 422 and "YYYY-MM-DD" in exc.value.message


def test_reading_marks_read_and_that_is_not_a_change(world, call):
    unread = next(e for e in emails(world).values() if not e["read"])
    before = world.copy_state()
    shown = call("show_email", email_id=unread["id"])
    assert shown["body"] == unread["body"] and shown["attachments"] == unread["attachments"]
    assert emails(world)[str(unread["id"])]["read"] is True
    assert diff_states(before, world.state, {"mail": BUILTIN.apps["mail"].volatile_fields}) == []
    call("mark_unread", email_id=unread["id"])
    assert emails(world)[str(unread["id"])]["read"] is False
    with pytest.raises(ApiError) as exc:
        call("show_email", email_id=100000)
    assert exc.value.status == 404 and "No email with id 100000" in exc.value.message


def test_send_email(world, call, me):
    sent_id = call("send_email", to=["Ana@Example.com", "ana@example.com"], subject="Hi", body="Hello", cc=["b@x.org"])[
        "email_id"
    ]
    sent = emails(world)[str(sent_id)]
    assert (sent["folder"], sent["sender"], sent["to"], sent["cc"]) == ("sent", me, ["ana@example.com"], ["b@x.org"])
    assert sent["thread_id"] == sent_id and sent["date"] == "2025-06-02T09:00:00Z"
    assert call("list_sent")[0]["email_id"] == sent_id
    with pytest.raises(ApiError) as exc:
        call("send_email", to=["Ana Lopez"], subject="Hi", body="x")
    assert exc.value.status == 422 and "not an email address" in exc.value.message
    with pytest.raises(ApiError) as exc:
        call("send_email", to=[], subject="Hi", body="x")
    assert exc.value.status == 422


def test_reply_goes_to_the_sender_in_the_same_thread(world, call, me):
    original = a_thread_email(world, me)
    reply = emails(world)[str(call("reply_email", email_id=original["id"], body="Sounds good")["email_id"])]
    assert reply["to"] == [original["sender"]] and reply["cc"] == []
    assert reply["subject"] == f"Re: {original['subject']}" and reply["thread_id"] == original["thread_id"]
    assert reply["in_reply_to"] == original["id"] and reply["body"] == "Sounds good"
    again = emails(world)[str(call("reply_email", email_id=reply["id"], body="PS")["email_id"])]
    assert again["to"] == [original["sender"]] and again["subject"] == reply["subject"]  # no "Re: Re:"


def test_reply_all_includes_everyone_but_me(world, call, me):
    original = a_thread_email(world, me)
    reply_id = call("reply_email", email_id=original["id"], body="Agreed", reply_all=True)["email_id"]
    reply = emails(world)[str(reply_id)]
    assert reply["to"] == [original["sender"]] + [a for a in original["to"] if a != me]
    assert reply["cc"] == [a for a in original["cc"] if a != me] and me not in reply["to"] + reply["cc"]


def test_forward_copies_attachments_and_quotes_the_original(world, call):
    original = next(e for e in emails(world).values() if e["attachments"])
    fwd_id = call("forward_email", email_id=original["id"], to=["sam@example.com"], body="FYI")["email_id"]
    fwd = emails(world)[str(fwd_id)]
    assert fwd["subject"] == f"Fwd: {original['subject']}" and fwd["forward_of"] == original["id"]
    assert fwd["attachments"] == original["attachments"] and fwd["attachments"] is not original["attachments"]
    assert fwd["body"].startswith("FYI") and original["body"] in fwd["body"]


def test_drafts_are_sent_with_send_draft(world, call):
    drafts = everything(call, "search_emails", folder="drafts")
    empty = next(d for d in drafts if not d["to"])
    with pytest.raises(ApiError) as exc:
        call("send_draft", email_id=empty["email_id"])
    assert exc.value.status == 422 and "recipients" in exc.value.message
    with pytest.raises(ApiError) as exc:
        call("reply_email", email_id=empty["email_id"], body="x")
    assert exc.value.status == 409 and "send_draft" in exc.value.message
    call("send_draft", email_id=empty["email_id"], to=["kim@example.com"])
    sent = emails(world)[str(empty["email_id"])]
    assert (sent["folder"], sent["to"], sent["date"]) == ("sent", ["kim@example.com"], "2025-06-02T09:00:00Z")
    with pytest.raises(ApiError) as exc:
        call("send_draft", email_id=empty["email_id"])
    assert exc.value.status == 409 and "not a draft" in exc.value.message


def test_delete_moves_to_trash_then_removes(world, call):
    email_id = everything(call, "list_inbox")[0]["email_id"]
    assert "trash" in call("delete_email", email_id=email_id)
    assert emails(world)[str(email_id)]["folder"] == "trash"
    assert email_id not in {e["email_id"] for e in everything(call, "list_inbox")}
    assert "for good" in call("delete_email", email_id=email_id)
    assert str(email_id) not in emails(world)


def test_labels_are_added_reused_listed_and_removed(world, call):
    email_id = next(e["id"] for e in emails(world).values() if "Work" not in e["labels"])
    assert "Work" in call("label_email", email_id=email_id, label="work")["labels"]  # existing spelling kept
    assert call("label_email", email_id=email_id, label="Work")["labels"].count("Work") == 1
    call("label_email", email_id=email_id, label="Taxes 2025")
    labels = {r["label"]: r for r in everything(call, "list_labels")}
    assert labels["Taxes 2025"]["email_count"] == 1
    assert labels["Work"]["email_count"] == sum("Work" in e["labels"] for e in emails(world).values())
    assert "Taxes 2025" not in call("label_email", email_id=email_id, label="taxes 2025", remove=True)["labels"]
    with pytest.raises(ApiError) as exc:
        call("label_email", email_id=email_id, label="Taxes 2025", remove=True)
    assert exc.value.status == 404
