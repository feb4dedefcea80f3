"""The round planner: estimates follow the facts, corrections follow the job's own rounds,
and `round_plan` pins the choice. Pure functions: no Spark."""

from __future__ import annotations

import json

import pytest

from airflow_backfill.engine.planning.round_plan import (
    ANY_PLAN,
    APPEND,
    AUTO,
    DELETE,
    DIFFERENCE,
    INCREMENTAL,
    MERGE,
    OVERWRITE,
    RECOMPUTE,
    REPLACE,
    ROUND_PLAN_CHOICES,
    Rates,
    RoundFacts,
    RoundPlan,
    TableFacts,
    aggregate_recompute_writes,
    aggregate_round_estimates,
    before_the_feed,
    choose,
    correction_for,
    corrections,
    feed_rows,
    observation,
    readers_cost,
    recompute_saves,
    recompute_writes,
    round_estimates,
    stateless_recompute_writes,
    with_first_use,
)
from airflow_backfill.engine.planning.round_plan import cheapest as cheapest_way
from airflow_backfill.job import ROUND_PLANS

MV_ROWS = 6_000_000
"""A stateless MV over TPC-H lineitem at scale factor 1."""


def facts(changed_keys: int, touched: int, *, kept: float = 1.0, new_keys_only: bool = False) -> RoundFacts:
    """A round changing `changed_keys` keys, `kept` of which still have a row afterwards."""
    return RoundFacts(change_rows=2 * changed_keys, changed_keys=changed_keys,
                      present_rows=int(changed_keys * kept),
                      table=TableFacts(rows=MV_ROWS, touched_rows=touched, new_keys_only=new_keys_only),
                      upstream_rows=MV_ROWS)


def cheapest(round_facts: RoundFacts, requested: str = AUTO, fixes: dict[str, float] | None = None) -> str:
    return choose(round_estimates(round_facts, Rates()), fixes or {}, requested).plan


def test_the_job_field_and_the_planner_offer_the_same_choices():
    assert ROUND_PLANS == ROUND_PLAN_CHOICES


def test_the_plan_follows_the_size_and_spread_of_the_change():
    assert cheapest(facts(12_000, MV_ROWS)) == REPLACE  # updates scattered over the MV
    assert cheapest(facts(6_000, MV_ROWS, kept=0)) == DELETE  # the line items of deleted orders
    assert cheapest(facts(1, 6_000)) == REPLACE  # one row, its key range in one file
    assert cheapest(facts(12_000, 0, new_keys_only=True)) == APPEND
    # 10 % of the rows updated: even once the feed is read, finding and marking 1.2 M keys
    # costs more than reading the upstream again (such a round recomputes before its feed)
    assert cheapest(facts(1_200_000, MV_ROWS)) == RECOMPUTE
    assert cheapest(facts(1_200_000, MV_ROWS, kept=0.5)) == RECOMPUTE  # updates and deletes: no replace
    # Updates and deletes together, clustered in a few files: one replace that deletes the
    # keys without a new row, not a merge of those files (dozens of jobs and a shuffle).
    assert cheapest(facts(30_000, 400_000, kept=0.5)) == REPLACE
    assert cheapest(facts(30_000, 400_000, kept=0.5), fixes={REPLACE: 4.0}) == MERGE


@pytest.mark.parametrize("prove_key", [True, False])
def test_a_large_change_recomputes_before_its_feed_is_read(prove_key):
    large = before_the_feed(1_200_000, MV_ROWS, Rates(), aggregate=False, prove_key=prove_key)
    assert recompute_saves(large[RECOMPUTE], large[INCREMENTAL])
    small = before_the_feed(120_000, MV_ROWS, Rates(), aggregate=False, prove_key=prove_key)
    assert not recompute_saves(small[RECOMPUTE], small[INCREMENTAL])
    unproved = before_the_feed(1_200_000, MV_ROWS, Rates(), aggregate=False, prove_key=False)
    assert large[RECOMPUTE] >= unproved[RECOMPUTE]


def test_a_range_without_inserts_counts_the_keys_it_must_find_before_its_feed():
    """1 % of the line items updated (120 k change rows): over the whole MV, finding their
    keys costs more than a recompute; in a few files, or with no file to search, it does not."""
    scattered = TableFacts(rows=MV_ROWS, touched_rows=MV_ROWS)
    clustered = TableFacts(rows=MV_ROWS, touched_rows=60_000)
    above = TableFacts(rows=MV_ROWS, touched_rows=0, new_keys_only=True)

    def recomputes(located: TableFacts | None) -> bool:
        estimates = before_the_feed(120_000, MV_ROWS, Rates(), aggregate=False, prove_key=True, inserts=False,
                                    located=located)
        return recompute_saves(estimates[RECOMPUTE], estimates[INCREMENTAL])

    assert recomputes(scattered)
    assert not recomputes(clustered)
    assert not recomputes(above)
    assert not recomputes(None)  # nothing known of the keys: the least writes nothing
    aggregate = before_the_feed(120_000, MV_ROWS, Rates(), aggregate=True, prove_key=False, located=scattered)
    assert not recompute_saves(aggregate[RECOMPUTE], aggregate[INCREMENTAL])  # its writes find no MV key


def test_a_small_table_is_overwritten():
    small = RoundFacts(change_rows=10, changed_keys=5, present_rows=5, table=TableFacts(rows=200, touched_rows=200),
                       upstream_rows=10_000)
    assert cheapest(small) == OVERWRITE


def test_round_plan_pins_the_choice():
    big = facts(1_200_000, MV_ROWS)
    assert cheapest(big, INCREMENTAL) != RECOMPUTE
    assert cheapest(facts(12_000, MV_ROWS), MERGE) == MERGE  # replace is cheaper, but its feed is not for every reader
    assert cheapest(facts(12_000, 0, new_keys_only=True), MERGE) == APPEND
    aggregate = aggregate_round_estimates(3 * MV_ROWS, {OVERWRITE: 0.5}, {MERGE: 0.5}, MV_ROWS, 4, 4, Rates())
    assert choose(aggregate, {}, MERGE).plan == INCREMENTAL
    assert cheapest(facts(1, 6_000), RECOMPUTE) == RECOMPUTE
    with pytest.raises(ValueError, match="round_plan must be one of"):
        cheapest(big, "sometimes")


def test_corrections_come_from_the_last_rounds_of_each_plan_and_are_bounded():
    rounds = [{"plan": REPLACE, "estimate_s": 1.0, "seconds": s} for s in (9.0, 3.0, 3.0, 3.0, 3.0, 3.0)]
    rounds += [{"plan": MERGE, "estimate_s": 2.0, "seconds": 1.0}] * 3
    rounds += [{"plan": RECOMPUTE, "estimate_s": 1, "seconds": 99}] * 3
    rounds += [{"plan": APPEND, "estimate_s": 0, "seconds": 1.0}] * 3  # no estimate: ignored
    rounds += [{"plan": DELETE, "estimate_s": 1.0, "seconds": 4.0}] * 2  # too few to correct
    assert corrections(rounds) == {REPLACE: 3.0, MERGE: 0.5, RECOMPUTE: 5.0, ANY_PLAN: 5.0}  # last five: 99 99 99 4 4


def test_a_plan_that_never_ran_is_corrected_by_the_jobs_other_rounds():
    """A shared forward under load ran every incremental round 2.6x slower than estimated;
    a never-run recompute must not look cheaper for having no rounds of its own."""
    loaded = [{"plan": INCREMENTAL, "estimate_s": 2.0, "seconds": 5.2}] * 4
    learned = corrections(loaded)
    assert learned == {INCREMENTAL: 2.6, ANY_PLAN: 2.6}
    assert correction_for(learned, RECOMPUTE) == 2.6 and correction_for({}, RECOMPUTE) == 1.0
    assert choose({INCREMENTAL: 2.0, RECOMPUTE: 1.9}, {INCREMENTAL: 2.6}, AUTO).plan == RECOMPUTE  # before
    assert choose({INCREMENTAL: 2.0, RECOMPUTE: 1.9}, learned, AUTO).plan == INCREMENTAL


def test_a_plan_that_ran_slower_than_estimated_loses_to_a_recompute():
    pair = facts(12_000, MV_ROWS)
    estimates = round_estimates(pair, Rates())
    assert choose(estimates, {}, AUTO).plan == REPLACE
    slow = estimates[RECOMPUTE] / estimates[REPLACE] * 1.5
    chosen = choose(estimates, {REPLACE: slow, OVERWRITE: 1.5}, AUTO)
    assert chosen.plan == RECOMPUTE
    assert chosen.base_estimate == pytest.approx(estimates[RECOMPUTE])
    assert chosen.reason.startswith("cheapest estimate") and ", next " in chosen.reason


def test_auto_recomputes_only_when_that_saves_a_second_and_a_fifth():
    assert choose({REPLACE: 2.0, RECOMPUTE: 1.5}, {}, AUTO).plan == REPLACE  # saves too little
    assert choose({REPLACE: 2.0, RECOMPUTE: 0.9}, {}, AUTO).plan == RECOMPUTE
    assert choose({REPLACE: 20.0, RECOMPUTE: 16.5}, {}, AUTO).plan == REPLACE  # a second, but not a fifth
    assert choose({REPLACE: 20.0, RECOMPUTE: 15.5}, {}, AUTO).plan == RECOMPUTE
    assert choose({REPLACE: 2.0, RECOMPUTE: 1.5}, {}, RECOMPUTE).plan == RECOMPUTE


def test_the_plan_is_recorded_as_json_and_observed_against_its_uncorrected_estimate():
    chosen = choose({REPLACE: 1.0, RECOMPUTE: 4.0}, {REPLACE: 2.0}, AUTO).with_writes(state=OVERWRITE, mv=REPLACE)
    data = json.loads(chosen.to_json())
    assert data == {"plan": REPLACE, "estimates_s": {REPLACE: 2.0, RECOMPUTE: 4.0}, "reason": chosen.reason,
                    "writes": {"state": OVERWRITE, "mv": REPLACE}}
    assert chosen.label == "replace (state overwrite, mv replace)"
    assert observation(chosen, 2.5, 7) == {"plan": REPLACE, "estimate_s": 1.0, "seconds": 2.5, "epoch": 7}
    assert RoundPlan(APPEND, {}, "").label == APPEND


def test_an_aggregate_round_recomputes_only_when_its_change_outweighs_the_upstream():
    rates = Rates()
    writes = {OVERWRITE: 0.5}
    small_change = aggregate_round_estimates(12_000, writes, writes, MV_ROWS, 4, 4, rates)
    assert choose(small_change, {}, AUTO).plan == INCREMENTAL
    huge_change = aggregate_round_estimates(3 * MV_ROWS, writes, writes, MV_ROWS, 4, 4, rates)
    assert choose(huge_change, {}, AUTO).plan == RECOMPUTE


# ---- the MV's readers and a fresh process ---------------------------------------------------

CHAIN_MV_ROWS = 2_000_000
"""A stateless MV over about 2 M line items, as `bench/chain.py` builds it; `small_change`
updates 10,000 of its upstream's keys (0.5 %)."""


def small_change() -> RoundFacts:
    return RoundFacts(change_rows=20_000, changed_keys=10_000, present_rows=10_000,
                      table=TableFacts(rows=CHAIN_MV_ROWS, touched_rows=CHAIN_MV_ROWS), upstream_rows=CHAIN_MV_ROWS)


def test_a_write_feeds_about_two_rows_per_changed_key_and_an_overwrite_every_row_twice():
    assert feed_rows(REPLACE, 10, 8, 1_000) == 18
    assert feed_rows(MERGE, 10, 8, 1_000) == 18
    assert feed_rows(DIFFERENCE, 10, 8, 1_000) == 18
    assert feed_rows(DELETE, 10, 0, 1_000) == 10
    assert feed_rows(APPEND, 10, 10, 1_000) == 10
    assert feed_rows(OVERWRITE, 10, 8, 1_000) == 1_000 + 998
    assert feed_rows(RECOMPUTE, 1_000, 1_000, 1_000) == 2_000


def test_a_feed_costs_nothing_without_readers_and_at_most_each_readers_own_recompute():
    rates = Rates()
    assert readers_cost(4_000_000, 0, CHAIN_MV_ROWS, rates) == 0.0
    assert readers_cost(20_000, 2, CHAIN_MV_ROWS, rates) == pytest.approx(2 * 20_000 * rates.per_reader_row)
    whole = readers_cost(4_000_000, 1, CHAIN_MV_ROWS, rates)
    assert whole < 4_000_000 * rates.per_reader_row
    assert whole == pytest.approx(rates.fixed[RECOMPUTE] + CHAIN_MV_ROWS * (rates.per_upstream_row
                                                                        + rates.per_compared_row))


def test_without_readers_the_estimates_are_those_of_the_mv_alone():
    round_facts = small_change()
    assert round_estimates(round_facts, Rates(), 0) == round_estimates(round_facts, Rates())
    assert set(stateless_recompute_writes(round_facts, Rates())) == {OVERWRITE}
    assert set(recompute_writes(3.0, CHAIN_MV_ROWS, {REPLACE: 1.0}, 0, Rates())) == {OVERWRITE}


def test_a_small_change_recomputes_alone_and_stays_incremental_once_an_mv_reads_it():
    """Measured on such an MV: before the feed, 1.90 s to recompute against at least 3.05 s
    incremental, and the feed of the recompute held every row twice. With one MV over it,
    the recompute counts that feed (or the comparison that avoids it), and the round
    replaces the 10,000 keys: a feed of two rows per changed row."""
    rates = Rates()
    alone = before_the_feed(20_000, CHAIN_MV_ROWS, rates, aggregate=False, prove_key=True, inserts=False,
                            located=TableFacts(rows=CHAIN_MV_ROWS, touched_rows=CHAIN_MV_ROWS))
    assert alone[RECOMPUTE] == pytest.approx(1.90, abs=0.01) and alone[INCREMENTAL] == pytest.approx(3.05, abs=0.01)
    assert recompute_saves(alone[RECOMPUTE], alone[INCREMENTAL])
    read = before_the_feed(20_000, CHAIN_MV_ROWS, rates, aggregate=False, prove_key=True, inserts=False,
                           located=TableFacts(rows=CHAIN_MV_ROWS, touched_rows=CHAIN_MV_ROWS), readers=1,
                           mv_rows=CHAIN_MV_ROWS)
    assert not recompute_saves(read[RECOMPUTE], read[INCREMENTAL])
    chosen = choose(round_estimates(small_change(), rates, readers=1), {}, AUTO)
    assert chosen.plan == REPLACE
    assert feed_rows(chosen.plan, 10_000, 10_000, CHAIN_MV_ROWS) == 2 * 10_000


def test_a_recompute_with_readers_writes_the_difference_unless_most_rows_change():
    rates = Rates()
    pinned = choose(round_estimates(small_change(), rates, readers=1), {}, RECOMPUTE)
    assert pinned.plan == RECOMPUTE
    assert cheapest_way(stateless_recompute_writes(small_change(), rates, readers=1)) == DIFFERENCE
    half = RoundFacts(change_rows=2_000_000, changed_keys=1_000_000, present_rows=1_000_000,
                      table=TableFacts(rows=CHAIN_MV_ROWS, touched_rows=CHAIN_MV_ROWS), upstream_rows=CHAIN_MV_ROWS)
    assert choose(round_estimates(half, rates, readers=1), {}, AUTO).plan == RECOMPUTE
    assert cheapest_way(stateless_recompute_writes(half, rates, readers=1)) == OVERWRITE  # its readers recompute too


def test_an_aggregates_recompute_counts_its_mvs_feed_the_same_way():
    rates = Rates()
    writes = {REPLACE: 1.2, MERGE: 3.2}
    alone = aggregate_recompute_writes(CHAIN_MV_ROWS, 100_000, 100_000, writes, rates)
    assert set(alone) == {OVERWRITE}
    read = aggregate_recompute_writes(CHAIN_MV_ROWS, 100_000, 100_000, writes, rates, readers=3)
    assert cheapest_way(read) == DIFFERENCE
    assert read[DIFFERENCE] == pytest.approx(alone[OVERWRITE] - rates.fixed[OVERWRITE] - 100_000
                                             * rates.per_written_row + 100_000 * rates.per_compared_row + 1.2)


def test_a_fresh_process_counts_each_plans_first_use_once():
    rates = Rates(first_use={REPLACE: 3.0, RECOMPUTE: 10.0, MERGE: 5.0})
    estimates = {REPLACE: 3.0, RECOMPUTE: 1.9, MERGE: 7.0}
    fresh = with_first_use(estimates, frozenset(), rates)
    assert fresh == {REPLACE: 6.0, RECOMPUTE: 11.9, MERGE: 12.0}
    after_replace = with_first_use(estimates, frozenset({REPLACE}), rates)  # the shared 3 s are paid
    assert after_replace == {REPLACE: 3.0, RECOMPUTE: 8.9, MERGE: 9.0}
    assert with_first_use(estimates, frozenset(estimates), rates) == estimates


def test_the_measured_first_uses_keep_a_cold_process_from_a_recompute_the_warm_figures_favour():
    """The same round in a phase's fresh JVM: the warm figures recompute (1.90 s against
    3.05 s), which took 12.4 s there."""
    rates = Rates()
    alone = before_the_feed(20_000, CHAIN_MV_ROWS, rates, aggregate=False, prove_key=True, inserts=False,
                            located=TableFacts(rows=CHAIN_MV_ROWS, touched_rows=CHAIN_MV_ROWS))
    cold = with_first_use(alone, frozenset(), rates)
    assert not recompute_saves(cold[RECOMPUTE], cold[INCREMENTAL])
    assert recompute_saves(*(with_first_use(alone, frozenset({RECOMPUTE, INCREMENTAL}), rates)[plan]
                             for plan in (RECOMPUTE, INCREMENTAL)))


def test_a_process_plans_its_first_round_cold_and_later_rounds_warm(tmp_path):
    """`plan_round` adds the first use of each plan this process has not run: the warm
    figures' recompute loses in a fresh process and wins once the process has run one."""
    from airflow_backfill.engine.rounds import plan_choice, warmth
    from airflow_backfill.job import BackfillJob

    job = BackfillJob(name="cold", source=str(tmp_path / "upstream"), target=str(tmp_path / "mv"),
                      query="SELECT id FROM source", primary_key=["id"])
    warm = {REPLACE: 3.05, RECOMPUTE: 1.0}
    warmth.forget()
    first = plan_choice.plan_round(job, warm, "a fresh process")
    assert first.plan == REPLACE
    assert first.base_estimate == pytest.approx(3.05 + Rates().first_use[REPLACE])
    plan_choice.record_round(job, first, 7.9, 1)
    assert plan_choice.plan_round(job, warm, "recompute still cold").plan == REPLACE
    warmth.mark_run(RoundPlan(RECOMPUTE, {}, "a round of it"))
    assert plan_choice.plan_round(job, warm, "all warm").plan == RECOMPUTE
