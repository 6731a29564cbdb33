"""The router in the Amaranth simulator: one router at the centre of a 3 x 3 mesh, its
four neighbours modelled in Python (credit-counting senders, stalling receivers), a
scoreboard that checks every flit, and a watchdog that fails on deadlock
(:mod:`sim.router_bench`). ``make mutate`` runs these tests on Verilator builds of the
router's mutants (:mod:`tb.router_tb`), so each must stand alone: no fixtures but
``seed``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rtl.router import LINK_PORTS, READ_PORTS, Router
from sim import coverage
from sim.router_bench import HERE, K, Packet, bench_router, expected_ports, run
from spec.noc import MessageClass, Port, branch_region, multicast_mask


def test_single_flits_take_one_router_cycle():
    """Every source to every output it can reach, one packet at a time: the flit leaves
    2 cycles after it is offered (1 router cycle, then the output register / ejection
    buffer), i.e. 2 cycles per hop with the link."""
    cases = [(Port.L, (x, y)) for x in range(K) for y in range(K)]
    cases += [(Port.W, (2, 1)), (Port.W, (1, 0)), (Port.W, (1, 2)), (Port.W, (1, 1)),
              (Port.E, (0, 1)), (Port.E, (1, 2)), (Port.N, (1, 2)), (Port.N, (1, 1)),
              (Port.S, (1, 0)), (Port.S, (1, 1))]
    packets = [Packet(i, source, vc=i % 2, dst=dst, start=8 * i)
               for i, (source, dst) in enumerate(cases)]
    result = run(packets)
    board = result["board"]
    assert len(board.delivered) == len(packets)
    for cycle, port, pid in board.delivered:
        packet = board.packets[pid]
        assert {port} == expected_ports(board.router, packet)
        assert cycle - result["sent_at"][pid] == board.router.hop_latency == 2, \
            f"{packet.source.name} -> {packet.dst}"


def test_wormhole_packets_on_both_vcs_under_stalls(seed):
    rng = np.random.default_rng(seed + 1)
    packets, pid = [], 0
    sources = {Port.L: [(x, y) for x in range(K) for y in range(K)],
               Port.W: [(2, 0), (2, 2), (1, 0), (1, 2), (1, 1)],
               Port.E: [(0, 0), (0, 2), (1, 1)], Port.N: [(1, 2), (1, 1)],
               Port.S: [(1, 0), (1, 1)]}
    for _ in range(12):
        for source, dsts in sources.items():
            dst = dsts[rng.integers(len(dsts))]
            packets.append(Packet(pid, source, vc=int(rng.integers(2)),
                                  length=int(rng.integers(1, 6)), dst=dst))
            pid += 1
    result = run(packets, seed=seed + 2, idle=0.2, stall=0.4, eject_stall=0.4)
    assert result["dropped"] == 0 and result["error"] == 0


#: Destinations a packet arriving on each port can still have (XY: no U-turns, no
#: turning from Y back into X).
REACHABLE = {
    Port.L: [(x, y) for x in range(K) for y in range(K)],
    Port.W: [(x, y) for x in (1, 2) for y in range(K)],
    Port.E: [(x, y) for x in (0, 1) for y in range(K)],
    Port.N: [(1, 1), (1, 2)],
    Port.S: [(1, 0), (1, 1)],
}


def test_random_unicast_and_multicast_traffic(seed):
    """Random packets from every input to every destination it can reach, random
    multicasts from every input (to nodes still ahead of it), both VCs, random lengths,
    idle inputs and stalled outputs: every flit delivered once, in order, to the right
    outputs."""
    rng = np.random.default_rng(seed + 100)
    nodes = REACHABLE[Port.L]
    packets = []
    for pid in range(400):
        # The local port more often: its multicasts are the ones with 31 branch sets.
        source = Port.L if rng.random() < 0.4 else list(Port)[rng.integers(1, len(Port))]
        vc = int(rng.integers(2))
        if source is Port.L and rng.random() < 0.7:
            # A random non-empty set of output branches, then some nodes of each.
            branches = [p for p in Port if rng.random() < 0.5] or [Port(rng.integers(5))]
            chosen = []
            for branch in branches:
                region = [n for n in nodes
                          if multicast_mask([n], K) & branch_region(HERE, branch, K)]
                chosen += [n for n in region if rng.random() < 0.5] or \
                    [region[rng.integers(len(region))]]
            packets.append(Packet(pid, source, vc=vc, mask=multicast_mask(chosen, K)))
        elif source is not Port.L and rng.random() < 0.3:
            # A multicast passing through: some of the nodes still ahead of it.
            ahead = REACHABLE[source]
            chosen = [n for n in ahead if rng.random() < 0.5] or [ahead[rng.integers(len(ahead))]]
            packets.append(Packet(pid, source, vc=vc, mask=multicast_mask(chosen, K)))
        else:
            dsts = REACHABLE[source]
            packets.append(Packet(pid, source, vc=vc, length=int(rng.integers(1, 5)),
                                  dst=dsts[rng.integers(len(dsts))]))
    result = run(packets, seed=seed + 101, idle=0.2, stall=0.4, eject_stall=0.3,
                 max_cycles=12000)
    assert result["dropped"] == 0 and result["error"] == 0


@pytest.mark.parametrize("vcs,depth", [(4, 2), (2, 1)])
def test_more_vcs_and_shallow_buffers(vcs, depth, seed):
    rng = np.random.default_rng(vcs + seed)
    packets = [Packet(i, Port.L if i % 2 else Port.W, vc=int(rng.integers(vcs)),
                      length=int(rng.integers(1, 5)),
                      dst=[(2, 1), (1, 2), (2, 0)][i % 3]) for i in range(40)]
    result = run(packets, vcs=vcs, depth=depth, seed=seed + 3, stall=0.3)
    outputs = {(port, pid) for _, port, pid in result["board"].delivered}
    assert len(outputs) == 40


def test_a_waiting_flit_does_not_block_younger_flits_bound_elsewhere():
    """No head-of-line blocking: a local packet holds the east output's VC 0 for 12
    flits; the west input's packet to the east waits for it, and the single flit that
    came in behind it on the same VC, bound north/south, leaves first (a FIFO buffer
    would hold it until the east output frees). Flits sharing an output keep their
    order (the scoreboard checks it)."""
    east, other = (2, 1), (1, 0)
    packets = [Packet(0, Port.L, vc=0, length=12, dst=east),
               Packet(1, Port.W, vc=0, length=2, dst=east, start=2),
               Packet(2, Port.W, vc=0, dst=other, start=3),
               Packet(3, Port.W, vc=0, dst=east, start=4)]
    board = run(packets)["board"]
    when = {pid: cycle for cycle, _, pid in board.delivered}
    assert board.router.route_table[other] is not Port.E
    assert when[2] < when[0] + 11 < when[1] < when[3], when  # heads; 0 ends at +11


def test_an_input_vc_sends_through_both_read_ports_in_one_cycle():
    """Two read ports per input VC (local/east/west and north/south): a local packet
    holds the east output's VC 0 and a packet from the north holds the south's; four
    single flits wait behind them in the west input's VC 0, bound east and south in
    turn. When both outputs free, the buffer drains two flits a cycle, one east and one
    south, each output in arrival order."""
    east, south = (2, 1), (1, 2)
    packets = [Packet(0, Port.L, vc=0, length=10, dst=east),
               Packet(1, Port.N, vc=0, length=10, dst=south)]
    packets += [Packet(2 + i, Port.W, vc=0, dst=(east, south)[i % 2], start=2 + i)
                for i in range(4)]
    board = run(packets)["board"]
    assert board.router.route_table[south] is Port.S
    when = {pid: cycle for cycle, _, pid in board.delivered}
    assert when[2] == when[3] and when[4] == when[5] == when[2] + 1, when
    assert when[2] > when[0] + 9 and when[2] > when[1] + 9, when  # behind the long ones


def test_full_buffers_drain_in_order_on_every_input_vc():
    """Every input VC fills its whole buffer behind an output held by another input's
    long packet, while single flits bound elsewhere pass it and free their slots out of
    order; when the output frees, the held flits leave in arrival order (the scoreboard
    checks order and payloads, the watchdog that every credit comes back)."""
    router = bench_router()
    blocker_of = {Port.L: Port.W}  # the input whose long packet holds the output
    for source in Port:
        by_output = {router.route_table[node]: node for node in REACHABLE[source]}
        held, passing = [o for o in by_output if o is not Port.L][0], Port.L
        if source is Port.L:
            held, passing = Port.E, Port.N
        blocker = blocker_of.get(source, Port.L)
        for vc in range(2):
            pattern = [held, passing, held, passing, held, held, passing, held, passing]
            packets = [Packet(0, blocker, vc=vc, length=12, dst=by_output[held])]
            packets += [Packet(1 + i, source, vc=vc, dst=by_output[o], start=2 + i)
                        for i, o in enumerate(pattern)]
            result = run(packets)
            board = result["board"]
            assert len(board.delivered) == 1 + len(pattern), (source, vc)  # heads
            when = {pid: cycle for cycle, _, pid in board.delivered}
            tail = when[0] + 11  # the blocker's last flit (no stalls)
            first_held = [1 + i for i, o in enumerate(pattern) if o is held][:4]
            assert all(when[pid] > tail for pid in first_held), (source, vc, when)
            # All four slots took a flit while the output was held (none is lost).
            assert all(result["sent_at"][pid] < tail for pid in first_held), \
                (source, vc, result["sent_at"])
            assert when[2] < tail, (source, vc, when)  # the first passing flit did not wait


def test_each_read_port_takes_turns_among_its_outputs():
    """Every input arbiter with two or more outputs: each of them held by another
    input's long packet while the input VC queues flits for them in turn; when they all
    free at once, the read port serves them round-robin: while every output still has
    a flit queued, any run of as many deliveries as outputs has one of each."""
    router = bench_router()
    outputs_from = {src: {router.route_table[node] for node in REACHABLE[src]} for src in Port}
    checked = 0
    for source in Port:
        for group in READ_PORTS:
            outputs = [o for o in group if o in outputs_from[source]]
            if len(outputs) < 2:
                continue
            for vc in range(2):
                packets, used = [], {source}
                for o in outputs:  # a blocker from another input (local last) holds o's VC
                    blocker = next(q for q in (*LINK_PORTS, Port.L)
                                   if q not in used and o in outputs_from[q])
                    used.add(blocker)
                    dst = next(n for n in REACHABLE[blocker] if router.route_table[n] is o)
                    packets.append(Packet(len(packets), blocker, vc=vc, length=12, dst=dst))
                targets = (outputs * 2)[:4]  # the bench's 4-flit buffer, full
                dst_of = {o: next(n for n in REACHABLE[source] if router.route_table[n] is o)
                          for o in outputs}
                first = len(packets)
                packets += [Packet(first + i, source, vc=vc, dst=dst_of[o], start=2 + i)
                            for i, o in enumerate(targets)]
                board = run(packets)["board"]
                order = [port for _, port, pid in sorted(board.delivered) if pid >= first]
                rounds = order[:len(targets) // len(outputs) * len(outputs)]
                for start in range(len(rounds) - len(outputs) + 1):
                    assert sorted(rounds[start:start + len(outputs)]) == sorted(outputs), \
                        (source.name, vc, [o.name for o in order])
                checked += 1
    assert checked == 12  # local: both ports; east and west inputs: both ports; 2 VCs


def _requesters(router: Router, output: Port) -> tuple[tuple[int, int], list]:
    """A destination behind ``output``, and the input VCs that may route to it."""
    dst = next(node for node in REACHABLE[Port.L] if router.route_table[node] is output)
    return dst, [(source, vc) for source in Port if dst in REACHABLE[source]
                 and source is not output or source is Port.L for vc in range(2)]


def test_round_robin_shares_every_output_fairly():
    """For each output, every input VC that can reach it streams single flits to it at
    once: while all are backlogged, any run of as many grants as there are requesters
    serves each of them once, and the output never idles."""
    router = bench_router()
    per_requester = 10
    for output in Port:
        dst, requesters = _requesters(router, output)
        packets = [Packet(i * len(requesters) + r, source, vc=vc, dst=dst)
                   for i in range(per_requester) for r, (source, vc) in enumerate(requesters)]
        board = run(packets)["board"]
        delivered = [(board.packets[pid].source, board.packets[pid].vc)
                     for _, port, pid in board.delivered if port is output]
        assert len(delivered) == len(packets), output
        count = len(requesters)
        window = delivered[count:count * (per_requester - 2)]  # all backlogged throughout
        for start in range(len(window) - count + 1):
            assert len(set(window[start:start + count])) == count, \
                f"{output.name}: {window[start:start + count]} is not one grant each"
        cycles = [c for c, port, _ in board.delivered if port is output]
        assert cycles[-1] - cycles[0] == len(cycles) - 1, \
            f"{output.name} idled while backlogged"


def test_every_pair_of_requesters_takes_turns_on_each_output():
    """For each output, every pair of input VCs that can reach it streams single flits
    to it at once, one pair after another: while both are backlogged the grants
    alternate. (A priority bit wrong for one requester shows only when that requester
    competes with a particular other.)"""
    router = bench_router()
    per_requester = 4
    for output in Port:
        dst, requesters = _requesters(router, output)
        packets, phases = [], []
        for phase, pair in enumerate(itertools.combinations(requesters, 2)):
            first = len(packets)
            packets += [Packet(first + 2 * i + r, source, vc=vc, dst=dst,
                               start=phase * (4 * per_requester + 8))
                        for i in range(per_requester) for r, (source, vc) in enumerate(pair)]
            phases.append(range(first, len(packets)))
        board = run(packets)["board"]
        order = [pid for _, port, pid in board.delivered if port is output]
        assert sorted(order) == list(range(len(packets))), output
        for pids in phases:
            turns = [(board.packets[pid].source, board.packets[pid].vc)
                     for pid in order if pid in pids]
            assert all(a != b for a, b in zip(turns, turns[1:], strict=False)), \
                f"{output.name}: {[(p.name, v) for p, v in turns]} does not alternate"


def test_multicast_branches_once_each():
    nodes = [(x, y) for x in range(K) for y in range(K)]
    sets = [nodes, [(0, 0), (2, 2)], [(1, 1)], [(1, 0), (1, 2), (0, 1)], [(2, 0), (2, 1)],
            [(0, 2)], nodes[:5]]
    packets = [Packet(i, Port.L, vc=i % 2, mask=multicast_mask(s, K)) for i, s in enumerate(sets)]
    # From the west (moving east): only nodes at x >= 1 can still be in its mask.
    east = [n for n in nodes if n[0] >= 1]
    packets += [Packet(10, Port.W, vc=0, mask=multicast_mask(east, K)),
                Packet(11, Port.N, vc=1, mask=multicast_mask([(1, 1), (1, 2)], K)),
                Packet(12, Port.E, vc=0, mask=multicast_mask([(0, 0), (1, 0)], K))]
    result = run(packets, seed=5, stall=0.5, eject_stall=0.3)
    board = result["board"]
    assert {(pid, port) for _, port, pid in board.delivered} == \
        {(pid, port) for pid, ports in board.expect.items() for port in ports}
    assert board.expect[0] == set(Port)


def test_local_backpressure_holds_the_eject_stream():
    """A mostly stalled ejection: nothing is lost, the packets wait, and the eject
    stream obeys the stream rules (checked by the scoreboard's order and the run)."""
    packets = [Packet(i, [Port.W, Port.N, Port.L, Port.E, Port.S][i % 5], vc=i % 2,
                      length=1 + i % 3, dst=HERE) for i in range(30)]
    result = run(packets, seed=7, eject_stall=0.8, watchdog=400)
    assert result["cycles"] > 60


def test_unroutable_packets_are_dropped_and_counted():
    bad = [
        Packet(0, Port.L, vc=0, length=3, dst=(3, 0)),       # outside the 3 x 3 mesh
        Packet(1, Port.L, vc=1, dst=(7, 7)),
        Packet(2, Port.L, vc=0, multicast=True),              # empty multicast mask
        Packet(3, Port.L, vc=1, length=2, mask=0b111),        # multi-flit multicast
        Packet(4, Port.L, vc=0, dst=(2, 1), cls=MessageClass.RESPONSE),  # wrong class
        Packet(5, Port.W, vc=1, length=4, dst=(0, 1)),        # a U-turn back west
    ]
    headless = Packet(6, Port.L, vc=1, length=2, dst=(2, 1), headless=True)  # 2 drops
    good = [Packet(10 + i, Port.L if i % 2 else Port.W, vc=i % 2, length=2, dst=(2, 2))
            for i in range(6)]
    result = run(bad[:3] + good[:3] + bad[3:] + [headless] + good[3:], seed=9, stall=0.2)
    assert result["dropped"] == len(bad) + 2
    assert result["error"] == 1


def test_every_input_vc_drops_whole_packets_and_keeps_going():
    """On every input VC: a 3-flit packet that cannot be routed (off the mesh from the
    local port, a U-turn from a link) is one drop and its body goes with it; a 2-flit
    fragment without a head is two; the good packet behind them still arrives."""
    router = bench_router()
    packets, pid = [], 0
    for source in Port:
        bad = (3, 0) if source is Port.L else \
            next(node for node in REACHABLE[Port.L] if router.route_table[node] is source)
        good = next(node for node in REACHABLE[source] if node != bad)
        for vc in range(2):
            packets += [Packet(pid, source, vc=vc, length=3, dst=bad),
                        Packet(pid + 1, source, vc=vc, length=2, dst=good, headless=True),
                        Packet(pid + 2, source, vc=vc, length=2, dst=good)]
            pid += 3
    result = run(packets, seed=11, stall=0.2, eject_stall=0.2)
    assert result["dropped"] == len(Port) * 2 * (1 + 2)
    assert result["error"] == 1
    assert len(result["board"].delivered) == len(Port) * 2


def test_every_output_vc_waits_for_its_credits():
    """Neighbours that almost never drain (90 % stalls) and a backlog on every input VC
    to every output it can reach: each output VC runs out of credits again and again.
    The bench fails a flit sent past the receiver's room, a credit returned twice, or a
    credit never returned (the watchdog), and every flit must arrive in order."""
    router = bench_router()
    packets, pid = [], 0
    for source in Port:
        for node in REACHABLE[source]:
            for vc in range(2):
                for _ in range(3):
                    packets.append(Packet(pid, source, vc=vc, length=2, dst=node))
                    pid += 1
    assert {router.route_table[p.dst] for p in packets} == set(Port)
    result = run(packets, seed=17, stall=0.9, eject_stall=0.9, max_cycles=20000,
                 watchdog=400)
    assert result["dropped"] == 0
    assert len(result["board"].delivered) == len(packets)


def test_only_the_turns_the_routing_makes_are_built():
    """Each input gets the outputs its flits can need: from the neighbour's routing and
    the XY multicast tree (so a Y-bound flit never turns back into X), and none at the
    mesh's edge; another routing function builds other turns."""
    P = Port
    centre = bench_router()
    assert centre.outputs_of == {P.L: tuple(P), P.N: (P.L, P.S), P.S: (P.L, P.N),
                                 P.E: (P.L, P.N, P.S, P.W), P.W: (P.L, P.N, P.E, P.S)}
    # Functional coverage's turn bins are these pairs.
    assert {i: set(o) for i, o in coverage._TURNS.items()} == \
        {p.name: {o.name for o in outs} for p, outs in centre.outputs_of.items()}
    corner = Router(0, 0, k=4)
    assert corner.outputs_of == {P.L: (P.L, P.E, P.S), P.N: (), P.E: (P.L, P.S),
                                 P.S: (P.L,), P.W: ()}

    def yx_route(here, dst):
        (x, y), (dx, dy) = here, dst
        if dy != y:
            return P.S if dy > y else P.N
        return P.E if dx > x else P.W if dx < x else P.L

    assert Router(1, 1, k=3, routing=yx_route).outputs_of[P.N] == (P.L, P.E, P.S, P.W)


def test_a_turn_the_routing_never_makes_is_dropped():
    """Flits from the north (travelling south) bound east, or a multicast from the north
    with a node to the east, cannot come from an XY neighbour: dropped whole and counted,
    and the packets behind them on the same VC still arrive."""
    router = bench_router()
    east = next(n for n in REACHABLE[Port.L] if router.route_table[n] is Port.E)
    bad = [Packet(0, Port.N, vc=0, length=3, dst=east),
           Packet(1, Port.N, vc=1, mask=multicast_mask([(1, 2), east], K))]
    good = [Packet(2 + i, Port.N, vc=i % 2, length=2, dst=REACHABLE[Port.N][i % 2])
            for i in range(4)]
    result = run(bad + good, seed=13, stall=0.2)
    assert result["dropped"] == len(bad) and result["error"] == 1
    assert {pid for _, _, pid in result["board"].delivered} == {p.pid for p in good}


def test_impossible_parameters_are_refused():
    for kwargs, match in (({"k": 1}, "k must"), ({"k": 9}, "k must"), ({"vcs": 3}, "even"),
                          ({"vcs": 10}, "vcs must"), ({"depth": 0}, "depth must"),
                          ({"payload_bits": 0}, "payload_bits"), ({"x": 4}, "x must"),
                          ({"y": -1}, "y must"), ({"routing": 3}, "routing must")):
        with pytest.raises(ValueError, match=match):
            Router(**kwargs)
    with pytest.raises(ValueError, match="off the mesh"):
        Router(0, 0, k=2, routing=lambda here, dst: Port.W)
    with pytest.raises(ValueError, match="delivers"):
        Router(0, 0, k=2, routing=lambda here, dst: Port.L)
