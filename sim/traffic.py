"""Synthetic traffic on a mesh, in hardware: a generator and a checking sink at every node,
so a Verilator run moves hundreds of thousands of packets with a Python wake-up per phase.

:class:`TrafficBench` wraps :class:`rtl.mesh.Mesh`. Every node draws, each cycle, a new
packet with probability ``rate / 2**16`` (an open-loop Bernoulli source) to a destination
chosen by the traffic ``pattern`` (:class:`Pattern`), queues it with its birth cycle,
and injects queued packets of ``length`` flits on the request class, on VC
``dst mod (vcs / 2)`` of it (so packets of one source to one destination share a VC and
arrive in order). ``phase`` steers the run: 0 generates nothing (drain), 1 generates
(warm-up), 2 generates packets *tagged* for measurement; the latency of a tagged packet
runs from its birth (source queueing included) to its tail's delivery.

Every sink checks every flit: a check field over (source, sequence number, birth cycle,
flit index), head/tail flags against the flit index, and, per source, that sequence
numbers increase (a packet is never duplicated nor overtaken on its path). Any
violation increments ``errors``. Sinks stall their ejection streams at random with
probability ``stall / 2**16``.

The MoE pattern (dispatch then combine): a token goes to two distinct random nodes (two
request packets); each of them answers with a one-flit response packet on the response
class once it has received the request, and the source counts the responses. A sink
whose response queue is full holds its request streams: requests wait on responses,
never the reverse, which is why the classes have VCs of their own.

Counters (outputs, summed over the nodes): ``generated``, ``refused`` (a full source
queue: the load offered but never queued), ``injected`` (packets whose head entered the
network), ``delivered`` (request packets whose tail arrived), ``delivered_flits``,
``window_flits`` (flits delivered while ``phase`` = 2), ``tagged_born``/``tagged_done``,
``latency_sum``/``latency_max`` (tagged packets), ``responses``, ``errors``, ``dropped``
(packets the routers dropped), ``cycle``.
"""

from __future__ import annotations

import enum as py_enum
from types import SimpleNamespace

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out

from rtl.mesh import Mesh
from spec.noc import DEFAULT_DEPTH, MessageClass, NocConfig

__all__ = ["PAYLOAD", "Pattern", "TrafficBench", "destination"]

SEQ_BITS, TIME_BITS, CHECK_BITS, INDEX_BITS = 16, 16, 8, 4
#: Longest packet (flits).
MAX_LENGTH = (1 << INDEX_BITS) - 1


class Pattern(py_enum.IntEnum):
    """Where a node's packets go (the usual synthetic patterns; Dally and Towles, ch. 3)."""

    UNIFORM = 0  # any other node, uniformly
    TRANSPOSE = 1  # (x, y) -> (y, x)
    BIT_COMPLEMENT = 2  # (x, y) -> (k-1-x, k-1-y)
    TORNADO = 3  # (x, y) -> ((x + ceil(k/2) - 1) mod k, (y + ceil(k/2) - 1) mod k)
    HOTSPOT = 4  # node `hotspot` with probability hot_rate / 2**16, else uniform
    NEIGHBOUR = 5  # the east neighbour (west on the east edge)
    MOE = 6  # two distinct uniform nodes, each answering with a response


def destination(pattern: Pattern, x: int, y: int, k: int) -> tuple[int, int] | None:
    """The destination of a deterministic pattern (None for random ones)."""
    shift = (k + 1) // 2 - 1
    return {
        Pattern.TRANSPOSE: (y, x),
        Pattern.BIT_COMPLEMENT: (k - 1 - x, k - 1 - y),
        Pattern.TORNADO: ((x + shift) % k, (y + shift) % k),
        Pattern.NEIGHBOUR: (x + 1 if x + 1 < k else x - 1, y),
    }.get(pattern)


class Payload(data.StructLayout):
    def __init__(self, k: int):
        super().__init__({
            "src": range(k * k), "seq": SEQ_BITS, "born": TIME_BITS, "tagged": 1,
            "index": INDEX_BITS, "check": CHECK_BITS,
        })


def PAYLOAD(k: int) -> int:  # noqa: N802 - a width
    return Payload(k).size


def _check(src, seq, born, index):
    """The check field of a flit: its other fields folded into CHECK_BITS by XOR, with a
    constant so that an all-zero flit fails."""
    word = Cat(seq, born, index, src, Const(0xA5, CHECK_BITS))
    fold = word[:CHECK_BITS]
    for i in range(CHECK_BITS, len(word), CHECK_BITS):
        fold = fold ^ word[i:i + CHECK_BITS]
    return fold


class TrafficBench(wiring.Component):
    """A ``k`` x ``k`` mesh with a traffic generator and a checking sink at every node
    (see the module docstring). ``queue``: packets a source can hold. ``corrupt``: a
    test hook, a node whose sink sees bit 0 of every payload inverted."""

    COUNTERS = ("generated", "refused", "injected", "delivered", "delivered_flits",
                "window_flits", "tagged_born", "tagged_done", "responses", "errors",
                "dropped")

    def __init__(self, k: int = 4, *, vcs: int = 2, depth: int = DEFAULT_DEPTH, queue: int = 16,
                 corrupt: int | None = None):
        self.config = NocConfig(k=k, payload_bits=PAYLOAD(k), vcs=vcs, depth=depth)
        self.mesh = Mesh(k, payload_bits=PAYLOAD(k), vcs=vcs, depth=depth)
        if not isinstance(queue, int) or queue < 2:
            raise ValueError(f"queue must be an integer >= 2, not {queue!r}")
        if corrupt is not None and corrupt not in range(k * k):
            raise ValueError(f"corrupt must name a node of the {k} x {k} mesh, not {corrupt!r}")
        self.k, self.queue, self.corrupt = k, queue, corrupt
        members = {
            "phase": In(2), "rate": In(16), "pattern": In(3), "hotspot": In(range(k * k)),
            "hot_rate": In(16), "length": In(INDEX_BITS), "stall": In(16),
            "cycle": Out(32), "latency_sum": Out(48), "latency_max": Out(TIME_BITS),
        }
        members |= {name: Out(32) for name in self.COUNTERS}
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.mesh = mesh = self.mesh
        nodes = self.k * self.k
        m.d.sync += self.cycle.eq(self.cycle + 1)
        # Per-node contributions to the counters, summed below.
        adds = {name: [] for name in self.COUNTERS}
        latencies, tagged_tails = [], []
        sinks = [self._sink(m, node, adds, latencies, tagged_tails) for node in range(nodes)]
        for node in range(nodes):
            self._source(m, node, adds, sinks[node])

        for name, terms in adds.items():
            if name == "dropped":
                continue
            total = sum(terms) if terms else 0
            m.d.sync += getattr(self, name).eq(getattr(self, name) + total)
        m.d.comb += self.dropped.eq(sum(mesh.dropped[i] for i in range(nodes)))
        m.d.sync += self.latency_sum.eq(self.latency_sum + sum(
            Mux(t, lat, 0) for t, lat in zip(tagged_tails, latencies, strict=True)))
        biggest = self.latency_max
        for i, (t, lat) in enumerate(zip(tagged_tails, latencies, strict=True)):
            stage = Signal(TIME_BITS, name=f"latency_max{i}")  # a signal per step: the
            m.d.comb += stage.eq(Mux(t & (lat > biggest), lat, biggest))  # expression stays linear
            biggest = stage
        m.d.sync += self.latency_max.eq(biggest)
        return m

    # --- a node's generator and injector ----------------------------------------------

    def _random(self, m: Module, node: int) -> Signal:
        """A 32-bit xorshift generator, one draw per cycle, seeded per node."""
        state = Signal(32, init=(0x9E3779B9 * (node + 1)) & 0xFFFF_FFFF | 1,
                       name=f"rng{node}")
        x = state ^ (state << 13)[:32]
        x = x ^ (x >> 17)
        x = x ^ (x << 5)[:32]
        m.d.sync += state.eq(x)
        return state

    def _uniform_other(self, m: Module, node: int, bits, name: str) -> Signal:
        """A node other than ``node``, uniform (from 8 random bits)."""
        nodes = self.k * self.k
        pick = Signal(range(nodes), name=name)
        draw = (bits[:8] * (nodes - 1)) >> 8  # 0 .. nodes - 2
        m.d.comb += pick.eq(draw + 1 if node == 0 else Mux(draw >= node, draw + 1, draw))
        return pick

    def _source(self, m: Module, node: int, adds: dict, sink: dict) -> None:
        cfg, k = self.config, self.k
        x, y = node % k, node // k
        rnd = self._random(m, node)
        generate = (self.phase != 0) & (rnd[:16] < self.rate)
        st = SimpleNamespace()
        st.__dict__.update(adds=adds, cfg=cfg, generate=generate, k=k, node=node, rnd=rnd,
                           sink=sink, x=x, y=y)
        self._destinations(m, st)
        self._inject(m, st)

    def _destinations(self, m: Module, st: SimpleNamespace) -> None:
        """Destinations of this cycle's draw, per pattern."""
        adds, generate, k, node, rnd, x = st.adds, st.generate, st.k, st.node, st.rnd, st.x
        y = st.y
        uniform = self._uniform_other(m, node, rnd[16:24], f"n{node}_uniform")
        second = self._uniform_other(m, node, rnd[24:32], f"n{node}_second")
        fixed = {}
        for pattern in Pattern:
            d = destination(pattern, x, y, k)
            if d is not None:
                fixed[pattern] = d[1] * k + d[0]
        dst = Signal(range(k * k), name=f"n{node}_dst")
        active = Signal(name=f"n{node}_active")  # this node has somewhere to send
        m.d.comb += [dst.eq(uniform), active.eq(1)]
        with m.Switch(self.pattern):
            for pattern, index in fixed.items():
                with m.Case(pattern):
                    m.d.comb += [dst.eq(index), active.eq(index != node)]
            with m.Case(Pattern.HOTSPOT):
                with m.If((rnd[8:24] < self.hot_rate) & (self.hotspot != node)):
                    m.d.comb += dst.eq(self.hotspot)
        # MoE: a second destination, distinct from the first.
        moe = self.pattern == Pattern.MOE
        # (the next node after `uniform` that is not this one, cyclically)
        following = [(i + 1) % (k * k) for i in range(k * k)]
        following = [f if f != node else (f + 1) % (k * k) for f in following]
        other = Signal(range(k * k), name=f"n{node}_other")
        m.d.comb += other.eq(Mux(second == uniform, Array(following)[uniform], second))

        entry = data.StructLayout({"dst": range(k * k), "dst2": range(k * k), "two": 1,
                                   "born": TIME_BITS, "tagged": 1})
        q = fifo.SyncFIFOBuffered(width=entry.size, depth=self.queue)
        m.submodules[f"queue{node}"] = q
        new = Signal(entry, name=f"n{node}_new")
        m.d.comb += [new.dst.eq(dst), new.dst2.eq(other), new.two.eq(moe),
                     new.born.eq(self.cycle[:TIME_BITS]), new.tagged.eq(self.phase == 2),
                     q.w_data.eq(new)]
        born_now = generate & active
        m.d.comb += q.w_en.eq(born_now)
        adds["generated"].append(born_now + (born_now & moe))
        adds["refused"].append((born_now & ~q.w_rdy) + (born_now & ~q.w_rdy & moe))
        adds["tagged_born"].append((born_now & q.w_rdy & (self.phase == 2))
                                   + (born_now & q.w_rdy & (self.phase == 2) & moe))
        st.__dict__.update(entry=entry, q=q)

    def _inject(self, m: Module, st: SimpleNamespace) -> None:
        """Injection: responses first (one flit on the response class), else the head of the
        queue (`length` flits, twice for a MoE token)."""
        adds, cfg, entry, k, node, q = st.adds, st.cfg, st.entry, st.k, st.node, st.q
        sink = st.sink
        resp_q = sink["responses"]
        head = Signal(entry, name=f"n{node}_head")
        m.d.comb += head.eq(q.r_data)
        sending = Signal(name=f"n{node}_sending")  # a request packet is under way
        second_half = Signal(name=f"n{node}_second_half")  # MoE: the second packet
        index = Signal(INDEX_BITS, name=f"n{node}_index")
        seq = Signal(SEQ_BITS, name=f"n{node}_seq")
        length = Mux(self.length == 0, 1, self.length)

        req_dst = Mux(second_half, head.dst2, head.dst)
        flit = Signal(cfg.flit, name=f"n{node}_flit")
        payload = Signal(Payload(k), name=f"n{node}_payload")
        resp = Signal(sink["resp_layout"], name=f"n{node}_resp")
        m.d.comb += resp.eq(resp_q.r_data)
        use_resp = ~sending & resp_q.r_rdy
        use_req = ~use_resp & q.r_rdy
        target = Mux(use_resp, resp.src, req_dst)
        tx, ty = Signal(3, name=f"n{node}_tx"), Signal(3, name=f"n{node}_ty")
        for i in range(k * k):
            with m.If(target == i):
                m.d.comb += [tx.eq(i % k), ty.eq(i // k)]
        per_class = cfg.vcs_per_class
        resp_vc = cfg.class_vcs(MessageClass.RESPONSE).start
        vc = Signal(range(cfg.vcs), name=f"n{node}_vc")
        request_vc = cfg.class_vcs(MessageClass.REQUEST).start + (
            target % per_class if per_class > 1 else 0)
        m.d.comb += vc.eq(Mux(use_resp, resp_vc, request_vc))
        last = Mux(use_resp, 1, index == length - 1)
        f_seq = Signal(SEQ_BITS, name=f"n{node}_f_seq")
        f_born = Signal(TIME_BITS, name=f"n{node}_f_born")
        f_index = Signal(INDEX_BITS, name=f"n{node}_f_index")
        m.d.comb += [
            f_seq.eq(Mux(use_resp, resp.seq, seq)), f_born.eq(Mux(use_resp, resp.born, head.born)),
            f_index.eq(Mux(use_resp, 0, index)),
            payload.src.eq(node), payload.seq.eq(f_seq), payload.born.eq(f_born),
            payload.tagged.eq(Mux(use_resp, resp.tagged, head.tagged)),
            payload.index.eq(f_index),
            payload.check.eq(_check(Const(node, range(k * k)), f_seq, f_born, f_index)),
            flit.head.eq(Mux(use_resp, 1, index == 0)), flit.tail.eq(last),
            flit.cls.eq(Mux(use_resp, MessageClass.RESPONSE, MessageClass.REQUEST)),
            flit.multicast.eq(0), flit.dst.x.eq(tx), flit.dst.y.eq(ty),
            flit.payload.eq(payload),
        ]
        fire = Signal(name=f"n{node}_fire")
        for v in range(cfg.vcs):
            inject = self.mesh.inject[node][v]
            m.d.comb += [inject.payload.eq(flit), inject.valid.eq((use_resp | use_req) & (vc == v))]
            with m.If(inject.valid & inject.ready):
                m.d.comb += fire.eq(1)
        m.d.comb += resp_q.r_en.eq(fire & use_resp)
        adds["injected"].append(fire & use_req & (index == 0))
        with m.If(fire & use_req):
            m.d.sync += [sending.eq(~last), index.eq(Mux(last, 0, index + 1))]
            with m.If(last):
                m.d.sync += seq.eq(seq + 1)
                with m.If(head.two & ~second_half):
                    m.d.sync += second_half.eq(1)
                with m.Else():
                    m.d.sync += second_half.eq(0)
                    m.d.comb += q.r_en.eq(1)

    # --- a node's checking sink -------------------------------------------------------

    def _sink(self, m: Module, node: int, adds: dict, latencies: list,
              tagged_tails: list) -> dict:
        cfg, k = self.config, self.k
        rnd = self._random(m, node + 1000)
        resp_layout = data.StructLayout({"src": range(k * k), "seq": SEQ_BITS,
                                         "born": TIME_BITS, "tagged": 1})
        resp_q = fifo.SyncFIFOBuffered(width=resp_layout.size, depth=4)
        m.submodules[f"responses{node}"] = resp_q
        last_seq = Array(Signal(SEQ_BITS, init=(1 << SEQ_BITS) - 1, name=f"n{node}_last{s}")
                         for s in range(k * k))
        stalled = rnd[:16] < self.stall
        length = Mux(self.length == 0, 1, self.length)
        moe = self.pattern == Pattern.MOE
        request_vcs = cfg.class_vcs(MessageClass.REQUEST)
        pushed = Const(0)  # a lower request VC pushes a response this cycle
        for v in range(cfg.vcs):
            eject = self.mesh.eject[node][v]
            flit = eject.payload
            p = Payload(k)(flit.payload ^ int(node == self.corrupt))
            is_request = v in request_vcs
            expect = Signal(INDEX_BITS, name=f"n{node}_vc{v}_expect")
            # A request tail in MoE needs room for its response (one push per cycle:
            # the lowest request VC wins, the others wait).
            can_respond = resp_q.w_rdy & ~pushed
            needs_room = is_request & moe & flit.tail
            m.d.comb += eject.ready.eq(~stalled & (~needs_room | can_respond))
            take = eject.valid & eject.ready
            packet_length = length if is_request else 1
            bad = ((p.check != _check(p.src, p.seq, p.born, p.index))
                   | (p.index != expect) | (flit.head != (p.index == 0))
                   | (flit.tail != (p.index == packet_length - 1)))
            in_order = Signal(name=f"n{node}_vc{v}_in_order")
            m.d.comb += in_order.eq(1)
            if is_request:
                ahead = (p.seq - last_seq[p.src])[:SEQ_BITS]
                m.d.comb += in_order.eq((ahead != 0) & ~ahead[SEQ_BITS - 1])
                with m.If(take & flit.head):
                    m.d.sync += last_seq[p.src].eq(p.seq)
            adds["errors"].append(take & (bad | (flit.head & ~in_order)))
            with m.If(take):
                m.d.sync += expect.eq(Mux(flit.tail, 0, p.index + 1))
            adds["delivered_flits"].append(take)
            adds["window_flits"].append(take & (self.phase == 2))
            tail = take & flit.tail
            if is_request:
                adds["delivered"].append(tail)
                latencies.append((self.cycle[:TIME_BITS] - p.born)[:TIME_BITS])
                tagged_tails.append(tail & p.tagged)
                adds["tagged_done"].append(tail & p.tagged)
                push = Signal(name=f"n{node}_vc{v}_push")
                m.d.comb += push.eq(tail & moe)
                with m.If(push):
                    m.d.comb += [resp_q.w_en.eq(1),
                                 resp_q.w_data.eq(Cat(p.src, p.seq, p.born, p.tagged))]
                pushed = pushed | push
            else:
                adds["responses"].append(tail)
        return {"responses": resp_q, "resp_layout": resp_layout}
