"""Who holds which taken message (core/taker_holdings.py): takes, acks, a taker gone, and undo."""

from ppmq.core.taker_holdings import TakerHoldings

A, B = ("t", "w"), ("t", "v")


def test_takes_and_acks_say_who_holds_what_and_a_gone_taker_gives_back_only_its_own():
    owners = TakerHoldings()
    owners.took(A, 1, [1, 2, 3])
    owners.took(A, 2, [4])
    owners.took(B, 1, [9])
    owners.release(A, [2, 2, 7])  # named twice, and one nobody took
    assert (owners.held(A), owners.holders(A)) == (3, {1, 2})
    assert owners.abandon(1) == [(A, [1, 3]), (B, [9])]
    assert (owners.held(A), owners.holders(A), owners.held(B)) == (1, {2}, 0)


def test_undo_puts_back_each_change_since_the_mark_newest_first():
    owners = TakerHoldings()
    owners.took(A, 1, [1, 2])
    owners.commit()
    mark = owners.mark()
    owners.release(A, [1, 1])  # the second mention finds nobody: undone first, then the first
    owners.took(A, 2, [2, 3])  # 2 passes from taker 1 to taker 2
    owners.prune(A, lambda m: m != 3)
    assert (owners.held(A), owners.holders(A)) == (1, {2})
    owners.undo(mark)
    assert (owners.held(A), owners.holders(A)) == (2, {1})
    assert [(key, sorted(ms)) for key, ms in owners.abandon(1)] == [(A, [1, 2])]


def test_what_a_caller_does_with_its_list_afterwards_changes_nothing_undo_puts_back():
    owners = TakerHoldings()
    ms = [1, 2]
    owners.took(A, 1, ms)
    ms.append(3)
    owners.undo()
    assert owners.held(A) == 0
