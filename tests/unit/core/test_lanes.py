"""What each lane of a subscriber with Connections > 1 carries (core/lanes.py), and
the broker's watch of what leaves flight (queue_rows.FlightWatch)."""

from __future__ import annotations

from ppmq.core.lanes import LaneLoads, carry, room
from ppmq.store.flight_index import FlightWatch


def test_the_least_loaded_open_lane_has_the_room_and_ties_go_to_the_lowest():
    lanes = [{"t": 3}, None, {"t": 1}, {}]
    assert room(lanes, "t", 4) == (3, 4)
    carry(lanes, 3, "t", 4)
    assert room(lanes, "t", 4) == (2, 3)
    assert room([{"t": 4}, None], "t", 4) == (-1, 0)
    assert room([{"t": 4}, {"u": 2}], "u", 4) == (0, 4)


def test_an_ack_frees_the_lane_that_carried_the_message_and_unknown_ones_are_ignored():
    loads = LaneLoads(3)
    loads.carry(0, "t", [1, 2])
    loads.carry(2, "t", [3])
    loads.left("t", [2, 3, 99])
    assert [c["t"] for c in loads.carried] == [1, 0, 0]
    assert loads.lanes([True, False, True]) == [{"t": 1}, None, {"t": 0}]


def test_a_message_sent_again_on_another_lane_moves_there():
    loads = LaneLoads(2)
    loads.carry(0, "t", [1])
    loads.carry(1, "t", [1])
    assert [c["t"] for c in loads.carried] == [0, 1]
    assert loads.full(1, "t", 1) and not loads.full(0, "t", 1)


def test_the_watch_reports_what_left_flight_net_of_what_came_back_and_of_what_was_undone():
    watch = FlightWatch({(1, 1), (2, 1)})
    watch.note(False, 2, 1, [3])  # a batch pushed: into flight, so nothing of (2, 1) left it
    watch.note(True, 1, 1, [5, 6])  # acked
    watch.note(True, 1, 2, [7])  # another subscription: not watched
    watch.note(True, 1, 1, [8])
    watch.note(False, 1, 1, [8])  # touched: back in flight
    mark = watch.mark()
    watch.note(True, 1, 1, [9])
    watch.undo(mark)  # that request was rolled back
    assert watch.gone() == {(1, 1): [5, 6]}
