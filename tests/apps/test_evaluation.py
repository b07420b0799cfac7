from agentloop.apps.evaluation import (
    StateEvaluator,
    added,
    answer_matches,
    contains,
    diff_states,
    removed,
    same_items,
    updated,
)


def state(**tables):
    return {"notes": {"notes": tables.get("notes", {}), "_sessions": tables.get("_sessions", {})}}


BEFORE = state(notes={"1": {"id": 1, "title": "a", "tags": ["x"]}, "2": {"id": 2, "title": "b", "tags": []}})


def test_diff_finds_added_removed_updated_and_ignores_bookkeeping():
    after = state(
        notes={"1": {"id": 1, "title": "A", "tags": ["x"]}, "3": {"id": 3, "title": "c", "tags": []}},
        _sessions={"tok": {"user": "me"}},
    )
    changes = {(c.kind, c.key): c for c in diff_states(BEFORE, after)}
    assert set(changes) == {("updated", "1"), ("removed", "2"), ("added", "3")}
    assert changes[("updated", "1")].fields == {"title"}


def test_diff_ignores_volatile_fields_only():
    after = state(notes={"1": {"id": 1, "title": "a", "tags": ["x"], "read": True}, "2": BEFORE["notes"]["notes"]["2"]})
    assert diff_states(BEFORE, after, {"notes": frozenset({"read"})}) == []
    assert len(diff_states(BEFORE, after)) == 1


def test_evaluator_passes_expected_change_and_flags_collateral_damage():
    ev = StateEvaluator((removed("notes", "notes", 2),))
    only_expected = state(notes={"1": BEFORE["notes"]["notes"]["1"]})
    verdict = ev.evaluate(BEFORE, only_expected, None)
    assert verdict.success and verdict.reward == 1.0

    collateral = state(notes={})
    verdict = ev.evaluate(BEFORE, collateral, None)
    assert not verdict.success
    assert verdict.reward == 0.5
    failed = [t for t in verdict.tests if not t.passed]
    assert failed[0].name == "no collateral damage" and "notes.notes[1] removed" in failed[0].detail


def test_nothing_done_fails_the_expectation():
    verdict = StateEvaluator((removed("notes", "notes", 2),)).evaluate(BEFORE, BEFORE, None)
    assert (verdict.passed, verdict.total, verdict.success) == (1, 2, False)


def test_added_record_must_match_fields():
    ev = StateEvaluator((added("notes", "notes", title="Plan", tags=same_items(["home", "x"])),))
    good = state(notes={**BEFORE["notes"]["notes"], "3": {"id": 3, "title": " plan ", "tags": ["x", "home"]}})
    bad = state(notes={**BEFORE["notes"]["notes"], "3": {"id": 3, "title": "Plan", "tags": ["home"]}})
    assert ev.evaluate(BEFORE, good, None).success
    assert not ev.evaluate(BEFORE, bad, None).success


def test_update_that_touches_other_fields_is_not_the_expected_update():
    ev = StateEvaluator((updated("notes", "notes", 1, title="new"),))
    right = state(notes={"1": {"id": 1, "title": "new", "tags": ["x"]}, "2": BEFORE["notes"]["notes"]["2"]})
    too_much = state(notes={"1": {"id": 1, "title": "new", "tags": []}, "2": BEFORE["notes"]["notes"]["2"]})
    assert ev.evaluate(BEFORE, right, None).success
    assert not ev.evaluate(BEFORE, too_much, None).success


def test_answers_compare_as_numbers_lists_and_normalised_text():
    assert answer_matches(1295.5, "$1,295.50")
    assert not answer_matches(1295.5, "1295")
    assert answer_matches(["Ann Lee", "Bo Chen"], "bo chen, Ann Lee")
    assert not answer_matches(["Ann Lee", "Bo Chen"], "Ann Lee")
    assert answer_matches("Hunter2x", " hunter2x. ")
    assert not answer_matches("Hunter2x", None)
    assert answer_matches(True, "yes") and not answer_matches(True, "no")


def test_question_needs_the_right_answer():
    ev = StateEvaluator((), answer=42)
    assert ev.evaluate(BEFORE, BEFORE, "42").success
    assert not ev.evaluate(BEFORE, BEFORE, "41").success


def test_contains_matcher():
    assert contains("Settled")("all settled now")
    assert not contains("settled")(42)


def test_volatile_field_changed_along_with_an_expected_update():
    before = {"files": {"files": {"1": {"id": 1, "content": "a", "last_opened_at": None}}}}
    after = {"files": {"files": {"1": {"id": 1, "content": "b", "last_opened_at": "2025-06-02T09:00:00Z"}}}}
    ev = StateEvaluator((updated("files", "files", 1, content="b"),), volatile={"files": frozenset({"last_opened_at"})})
    assert ev.evaluate(before, after, None).success
    strict = StateEvaluator((updated("files", "files", 1, content="b"),))
    assert not strict.evaluate(before, after, None).success


def test_inserted_ids_are_never_reused():
    from agentloop.apps.base import insert_record

    app_state = {"notes": {"1": {"id": 1}, "2": {"id": 2}}}
    assert insert_record(app_state, "notes", {})["id"] == 3
    del app_state["notes"]["3"]
    assert insert_record(app_state, "notes", {})["id"] == 4
