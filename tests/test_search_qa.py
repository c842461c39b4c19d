"""`search_qa` and the `self_play` data scheduler: BM25 search over the corpus (against a brute-force
count of matching words), the corpus's verification of proposals, and a bank of verified questions
that feeds the solver and survives a resume."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("bm25s")

from schedrl.data import SCHEDULERS, DataContext  # noqa: E402
from schedrl.data.base import ScoredGroup  # noqa: E402
from schedrl.envs.search_qa import SearchQA, corpus, search, top_record, verify  # noqa: E402


def test_search_finds_the_record_a_name_matches():
    """Every name is in exactly one record, so the record BM25 ranks first is the one brute force finds."""
    for r in corpus()[::17]:
        assert [x for x in corpus() if r.name in x.text.split(":")[0]] == [r]
        assert top_record(f"city of {r.name}?") == r and search(r.name) == r.text
    assert search("zzzz") == "no match"


def test_proposals_are_verified_against_the_corpus():
    r = corpus()[7]
    other = next(x for x in corpus() if x.city != r.city)
    assert verify(f"city of {r.name}?|{r.city}", r) == (f"city of {r.name}?", r.city)
    assert verify(f"pet of {r.name}?|{r.pet}", r) == (f"pet of {r.name}?", r.pet)
    assert verify(f"pet of {r.name}?|{r.pet}", r, "city") is None  # not the field asked for
    for bad in (
        f"city of {r.name}?|{other.city}",  # the wrong value
        f"city of {other.name}?|{other.city}",  # about another record than the one given
        f"{r.name}?|{r.city}",  # no field: ambiguous
        f"city {r.city} of {r.name}?|{r.city}",  # the answer in the question
        f"city of {r.name}|{r.city}",  # not a question
        "",
    ):
        assert verify(bad, r) is None, bad


def test_rewards_of_both_roles_and_the_warm_up_traces():
    source = SearchQA()
    tasks = source.sample("train", 8, seed=0)
    assert [t.domain for t in tasks] == ["solve", "propose"] * 4
    for t in tasks:
        assert source.reward(t, source.solution(t)) == 1.0
    solve = tasks[0]
    assert source.reward(solve, f"<<search x>>[no match]{solve.answer}x") == 0.0
    held_out = source.rule_source.sample("eval", 20, seed=0)
    assert {t.domain for t in held_out} == {"solve"}
    assert not {t.prompt for t in held_out} & {t.prompt for t in source.sample("train", 400, seed=0)}


def _ctx(source, seed=0):
    return DataContext(source, seed, 4, 10)


def test_self_play_trains_the_solver_on_verified_proposals_only():
    source = SearchQA()
    sched = SCHEDULERS.build("self_play", {"solve_share": 0.5}, _ctx(source))
    first = sched.next_batch(16)
    assert {t.domain for t, _ in first} == {"propose"}  # nothing verified yet
    groups = []
    for t, _ in first:
        r = next(x for x in corpus() if x.name == t.metadata["name"])
        f = t.metadata["field"]
        texts = (f"{f} of {r.name}?|{getattr(r, f)}", "nonsense", f"{f} of {r.name}?|{r.name}", "")
        groups.append(ScoredGroup(t, (1.0, 0.0, 0.0, 0.0), (0.0,) * 4, 0, texts))
    sched.observe(groups)
    assert len(sched.bank) == 4 and sched.metrics()["selfplay/verified_frac"] == pytest.approx(0.25)
    second = sched.next_batch(16)
    solve = [t for t, _ in second if t.domain == "solve"]
    assert len(solve) == 2 and all(t in sched.bank for t in solve)
    for t in solve:  # a banked question is a solve task the rule scores as any other
        assert source.reward(t, source.solution(t)) == 1.0
    resumed = SCHEDULERS.build("self_play", {"solve_share": 0.5}, _ctx(source))
    resumed.load_state_dict(sched.state_dict())
    assert resumed.bank == sched.bank and resumed.next_batch(16) == sched.next_batch(16)


def test_self_play_needs_a_task_with_both_roles():
    from schedrl.envs import make_task

    with pytest.raises(ValueError, match="'self_play' needs a task with proposer and solver roles"):
        SCHEDULERS.build("self_play", {}, _ctx(make_task("addition")))
    with pytest.raises(ValueError, match="solve_share"):
        SCHEDULERS.build("self_play", {"solve_share": 1.5}, _ctx(SearchQA()))


def test_balanced_draws_give_every_kind_of_question_its_turn():
    source = SearchQA()
    sched = SCHEDULERS.build("self_play", {"solve_share": 0.5}, _ctx(source))
    city = [source.solve_task(f"city of {r.name}?", r.city) for r in corpus()[:9]]
    pet = source.solve_task(f"pet of {corpus()[9].name}?", corpus()[9].pet)
    sched.bank = [*city, pet]
    assert all(pet in [t for t, _ in sched.next_batch(16)] for _ in range(5))  # 2 of 10: always in
    plain = SCHEDULERS.build("self_play", {"solve_share": 0.5, "balance": False}, _ctx(source))
    plain.bank = [*city, pet]
    assert sum(pet in [t for t, _ in plain.next_batch(16)] for _ in range(20)) < 20


@pytest.mark.train
def test_a_self_play_run_feeds_its_solver_from_its_own_proposals(tmp_path):
    """The real loop: proposals scored by the tools environment reach the scheduler's bank, and the next
    batches' solve tasks come from it."""
    import yaml

    import schedrl

    recipe = yaml.safe_load((Path(__file__).parents[1] / "examples/search_selfplay.yaml").read_text())
    recipe.update(steps=3, save_every=0, eval={"tasks": 0}, out_dir=str(tmp_path))
    rows = []
    schedrl.train(recipe, on_step=lambda s, m: rows.append(m))
    banks = [m["selfplay/bank"] for m in rows if "selfplay/bank" in m]
    assert len(banks) == 3 and banks[0] > 0 and banks == sorted(banks)
    assert rows[-1]["data/domain/solve"] > 0
