"""The KV scratchpad: banked SECDED-protected SRAM with several ports and a paged KV cache."""

from __future__ import annotations

from amaranth import Array, C, Cat, DomainRenamer, Module, Mux, Signal
from amaranth.lib import data, enum, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.ecc import Secded
from rtl import _ecc
from rtl.sim_gate import gated
from spec.config import MAX_TABLE_ENTRIES
from spec.numerics import NUMERICS
from spec.params import check_bool

__all__ = ["COUNTER_BITS", "KvOp", "KvRequest", "Request", "Response", "Scratchpad", "Status",
           "failed"]

#: Ports of the default scratchpad: tensor core, vector unit, network interface, KV append.
DEFAULT_PORTS = ("tc", "vu", "ni", "kv")
#: Width of the saturating ECC event counters.
COUNTER_BITS = 16
#: Responses a port may have outstanding (pipeline + response FIFO): enough for one
#: request per cycle when its response stream is always ready. A credit spent at cycle t
#: comes back at t + latency + 1 (the response is popped at t + latency, the count is a
#: register), so full rate needs latency + 1 = 6 credits.
RESPONSE_CREDITS = 6


def _log2(value: int) -> int:
    return value.bit_length() - 1


def _is_pow2(value: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        and value & (value - 1) == 0


def _lookup(items: list, index):
    """``items[index]`` as a mux; the list is padded with its last item to every value
    ``index`` can take, so the generated case statement is complete (and lints clean)."""
    padded = list(items) + [items[-1]] * ((1 << len(index)) - len(items))
    return Array(padded)[index]


def _bits_for(bound: int) -> int:
    """Bits that hold every value in [0, bound] (so ``bound`` itself, out of range, fits)."""
    return max(1, bound.bit_length())


class Status(data.StructLayout):
    """Status flags of a response; at most one error flag is set.

    - ``corrected``: a single-bit ECC error was corrected; the data is good.
    - ``uncorrectable``: a double-bit ECC error; the data field is 0 and must not be used.
    - ``bad_address``: an address past the memory, or a KV read of a token at or past the
      sequence's length. Nothing was accessed.
    - ``bad_request``: a KV request naming a sequence, logical page or word out of range.
    - ``kv_full``: a KV append to a sequence whose block table is exhausted.
    - ``unmapped``: a KV access to a logical page with no block-table entry.
    - ``bad_page``: a block-table write naming a physical page outside the cache.
    """

    def __init__(self):
        super().__init__({
            "corrected": 1,
            "uncorrectable": 1,
            "bad_address": 1,
            "bad_request": 1,
            "kv_full": 1,
            "unmapped": 1,
            "bad_page": 1,
        })


def failed(status):
    """True when a response's :class:`Status` reports an error (``corrected`` is not one:
    the data is good)."""
    return Cat(*(status[name] for name, _ in status.shape() if name != "corrected")).any()


class Request(data.StructLayout):
    """A plain port's request: word ``addr`` (flat, bank = low bits), ``write``, ``data``.

    With fault injection, ``flip`` (one bit per stored codeword bit) is XORed into the
    codeword on a write: a test hook, tied to 0 (or built without) in a real design.
    """

    def __init__(self, addr_bits: int, word_bits: int, flip_bits: int = 0):
        fields = {"addr": addr_bits, "write": 1, "data": word_bits}
        if flip_bits:
            fields["flip"] = flip_bits
        super().__init__(fields)


class Response(data.StructLayout):
    """A response: read ``data`` (0 on a write or an error), the request's ``write`` flag
    echoed (KV: set for APPEND), ``status``."""

    def __init__(self, word_bits: int):
        super().__init__({"data": word_bits, "write": 1, "status": Status()})


class KvOp(enum.Enum, shape=2):
    APPEND = 0  #: write word ``word`` of the next token of ``seq``; ``last`` commits it
    READ = 1    #: read word ``word`` of token ``index`` of ``seq``
    MAP = 2     #: block table: logical page ``index`` of ``seq`` -> physical page ``phys``
    RESET = 3   #: free ``seq``: length 0, every block-table entry of it unmapped


class KvRequest(data.StructLayout):
    """A KV port request (see :class:`KvOp`); every index field can hold one value past
    its range, so that an out-of-range request is representable and gets an error."""

    def __init__(self, word_bits: int, sequences: int, index_bound: int, token_words: int,
                 num_pages: int):
        super().__init__({
            "op": KvOp,
            "seq": _bits_for(sequences),
            "index": _bits_for(index_bound),
            "word": _bits_for(token_words),
            "last": 1,
            "phys": _bits_for(num_pages),
            "data": word_bits,
        })


class Scratchpad(wiring.Component):
    """Banked SRAM with per-word SECDED ECC, several ports and a paged KV cache.

    Storage is ``banks`` x ``depth`` words of ``word_bits`` data bits, each stored with
    its SECDED check bits (:class:`golden.ecc.Secded`, (72, 64) by default). Word address
    ``a`` lives in bank ``a % banks`` at row ``a // banks`` (low-order interleaving), so
    consecutive words go to different banks.

    Every port has a request stream ``<port>_req`` and a response stream ``<port>_resp``
    (:class:`Response`). Every request, read or write, good or bad, gets exactly one
    response, and each port's responses come back in its request order: all requests
    travel one fixed-latency pipeline. A port stalls (``ready`` low) when its bank is
    taken by another port this cycle or when it has ``RESPONSE_CREDITS`` responses
    outstanding; nothing is ever dropped or duplicated. Each bank grants one request per
    cycle, round-robin among the ports that want it (the last granted port goes last).
    Requests that touch no bank (errors, block-table operations) never wait for one.
    Ordering *between* ports is the arbitration order; a port sees its own writes.

    Plain ports take :class:`Request`. The KV port (``kv_port``) takes
    :class:`KvRequest`: it appends tokens of ``token_words`` words at a sequence's
    current length and reads tokens back, translating (sequence, logical page) to a
    physical page through a block table of ``sequences`` x ``max_pages`` entries; pages
    of ``page_size`` tokens fill the KV region, words ``[kv_base, kv_base + kv_words)``
    of the same memory (plain ports reach it too, by address). Token t of sequence s is
    at ``kv_base + (table[s][t // page_size] * token_words + word) * page_size + t %
    page_size``: pages are chunk-major (word w of every token of a page, then word w + 1),
    so a page is directly a GEMM operand (see :class:`spec.isa.GemmArgs`).
    Refused KV requests (see :class:`Status`) change nothing.

    ECC: writes store the encoded word (XOR ``flip`` with fault injection). Reads are
    decoded: a single-bit error is corrected (``corrected``), a double-bit error is
    reported (``uncorrectable``, data 0). The corrected word is not written back.

    Parameters
    ----------
    banks : int
        Number of banks, a power of two (1 … 64).
    depth : int
        Words per bank, a power of two (2 … 65536).
    word_bits : int
        Data bits per word (default 8 lanes of int8 = 64).
    ports : sequence of str
        Port names (identifiers, unique, at most 16).
    kv_port : str or None
        The port that is the KV port (must be in ``ports``); None for none.
    page_size : int
        Tokens per KV page, a power of two.
    token_words : int
        Words per token, a power of two.
    num_pages, sequences, max_pages : int
        Physical KV pages; sequences; block-table entries (logical pages) per sequence.
    kv_base : int or None
        First word of the KV region, a multiple of ``page_size * token_words``; default:
        the top of memory.
    addr_bits : int
        Width of a plain request's address (at least enough for the memory).
    fault_injection : bool
        Add the ``flip`` field to plain requests (test builds only).
    gate_clock : bool
        Simulation only (see :mod:`rtl.sim_gate`): the scratchpad's clock ticks only in
        cycles that can change it (a request offered, one in the pipelines or the KV
        stage, a response queued), which Verilator then skips.

    Attributes
    ----------
    <port>_req, <port>_resp : streams, one pair per port
    corrected_count, uncorrectable_count : Signal(16), out
        Saturating counts of corrected / uncorrectable reads since reset.
    <port>_conflicts : Signal(16), out, one per port
        Saturating count of the cycles this port's request waited because another port
        had its bank (a bank conflict lost), since reset.
    ecc_error : Signal, out
        Sticky: an uncorrectable word was read since reset.

    Latency and throughput
    ----------------------
    - Each port issues up to one request per cycle; each bank serves one per cycle. With
      no bank conflict and ready responses every port runs at one request per cycle.
    - A plain request accepted at cycle t has its response valid on ``<port>_resp`` at
      cycle t + ``latency`` (5: bank read, bank word register, syndrome register, two
      in the response FIFO); the KV port adds one cycle of address translation (6).
    - ``RESPONSE_CREDITS`` (6) = ``latency`` + 1: one request per cycle per port needs
      exactly that many responses in flight.
    - Bank memories: one synchronous, non-transparent read port and one write port each;
      a bank never reads and writes in the same cycle, so transparency never matters.
    """

    def __init__(self, banks: int = 4, depth: int = 256,
                 word_bits: int = NUMERICS.operand_bits * 8,
                 ports=DEFAULT_PORTS, kv_port: str | None = "kv", *,
                 page_size: int = 4, token_words: int = 1, num_pages: int = 16,
                 sequences: int = 4, max_pages: int = 4, kv_base: int | None = None,
                 addr_bits: int = 16, fault_injection: bool = False,
                 gate_clock: bool = False):
        for name, value, low, high in (("banks", banks, 1, 64), ("depth", depth, 2, 65536),
                                       ("page_size", page_size, 1, 1 << 16),
                                       ("token_words", token_words, 1, 1 << 16)):
            if not _is_pow2(value) or not low <= value <= high:
                raise ValueError(f"{name} must be a power of two in [{low}, {high}], not {value!r}")
        if not isinstance(word_bits, int) or isinstance(word_bits, bool) \
                or not 1 <= word_bits <= 1024:
            raise ValueError(f"word_bits must be an integer in [1, 1024], not {word_bits!r}")
        ports = tuple(ports)
        if not 1 <= len(ports) <= 16:
            raise ValueError(f"a scratchpad needs 1 to 16 ports, not {len(ports)}")
        if len(set(ports)) != len(ports):
            raise ValueError(f"port names must be unique: {ports}")
        for name in ports:
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"port name {name!r} is not an identifier")
        if kv_port is not None and kv_port not in ports:
            raise ValueError(f"kv_port {kv_port!r} is not one of the ports {ports}")
        for name, value in (("num_pages", num_pages), ("sequences", sequences),
                            ("max_pages", max_pages)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        if sequences * max_pages > MAX_TABLE_ENTRIES:
            raise ValueError(f"the block table ({sequences} x {max_pages}) may hold at most "
                             f"{MAX_TABLE_ENTRIES} entries")
        words = banks * depth
        page_words = page_size * token_words
        kv_words = num_pages * page_words if kv_port is not None else 0
        if kv_words > words:
            raise ValueError(f"{num_pages} KV pages of {page_words} words do not fit the "
                             f"{words}-word memory")
        if kv_base is None:
            kv_base = words - kv_words
        if not isinstance(kv_base, int) or kv_base < 0 or kv_base % page_words \
                or kv_base + kv_words > words:
            raise ValueError(f"kv_base {kv_base!r} must be a multiple of {page_words} with "
                             f"the {kv_words}-word KV region inside the {words}-word memory")
        if not isinstance(addr_bits, int) or not (words - 1).bit_length() <= addr_bits <= 32:
            raise ValueError(f"addr_bits must be in [{(words - 1).bit_length()}, 32] for "
                             f"{words} words, not {addr_bits!r}")

        self.banks, self.depth, self.word_bits = banks, depth, word_bits
        self.ports, self.kv_port = ports, kv_port
        self.page_size, self.token_words, self.num_pages = page_size, token_words, num_pages
        self.sequences, self.max_pages = sequences, max_pages
        self.kv_base, self.kv_words, self.words = kv_base, kv_words, words
        self.addr_bits = addr_bits
        self.fault_injection = check_bool("fault_injection", fault_injection)
        self.gate_clock = check_bool("gate_clock", gate_clock)
        #: Tokens a sequence can hold (its block-table row full).
        self.capacity = max_pages * page_size
        self.code = Secded(word_bits)
        #: Cycles from a plain request's acceptance to its response being valid.
        self.latency = 5
        self.kv_latency = 6

        self.request_layout = Request(addr_bits, word_bits,
                                      self.code.code_bits if fault_injection else 0)
        self.response_layout = Response(word_bits)
        self.kv_request_layout = KvRequest(word_bits, sequences,
                                           max(self.capacity, max_pages), token_words,
                                           num_pages)
        members = {}
        for name in ports:
            layout = self.kv_request_layout if name == kv_port else self.request_layout
            members[f"{name}_req"] = In(stream.Signature(layout))
            members[f"{name}_resp"] = Out(stream.Signature(self.response_layout))
        members |= {
            "corrected_count": Out(COUNTER_BITS),
            "uncorrectable_count": Out(COUNTER_BITS),
            "ecc_error": Out(1),
        }
        members |= {f"{name}_conflicts": Out(COUNTER_BITS) for name in ports}
        #: Word accesses (reads and writes of a bank) the ports start this cycle.
        members["accesses"] = Out(range(len(ports) + 1))
        super().__init__(members)

    def elaborate(self, platform):
        top = Module()
        # Gated, the logic goes into a module of its own, renamed into the gated domain.
        m = Module() if self.gate_clock else top
        # Each port's request is checked (and, on the KV port, translated) by its front
        # end, wins its bank by round-robin arbitration when it has a response credit,
        # and goes down a 3-stage pipeline into its response FIFO.
        fronts = [self._kv_front(m, getattr(self, f"{name}_req")) if name == self.kv_port
                  else self._plain_front(m, name, getattr(self, f"{name}_req"))
                  for name in self.ports]
        # What can change a register next cycle: a request offered (a plain front's
        # ``valid`` is its request's) or in the KV stage, one in a port's pipeline, a
        # response queued (a credit comes back when it is taken).
        busy = [f["valid"] for f in fronts]
        if self.kv_port is not None:
            busy.append(getattr(self, f"{self.kv_port}_req").valid)
        accepts, can = self._credits(m)
        bank_words, granted = self._banks(m, fronts, can)
        corrected, uncorrectable = [], []
        m.d.comb += self.accesses.eq(sum(accept & f["needs_bank"]
                                         for accept, f in zip(accepts, fronts, strict=True)))
        for p, (name, f) in enumerate(zip(self.ports, fronts, strict=True)):
            got_bank = Cat(granted[b][p] for b in range(self.banks)).any()
            accept = accepts[p]
            m.d.comb += accept.eq(f["valid"] & can[p] & (~f["needs_bank"] | got_bank))
            m.d.comb += f["ready"].eq(accept)
            conflicts = getattr(self, f"{name}_conflicts")
            with m.If(f["valid"] & f["needs_bank"] & can[p] & ~got_bank & ~conflicts.all()):
                m.d.sync += conflicts.eq(conflicts + 1)
            events = self._pipeline(m, name, f, accept, bank_words)
            corrected.append(events[0])
            uncorrectable.append(events[1])
            busy.append(events[2])
        self._ecc_counters(m, corrected, uncorrectable)
        if self.gate_clock:
            gated(top, "spad", Cat(*busy).any())
            top.submodules.core = DomainRenamer("spad")(m)
        return top

    def _credits(self, m: Module) -> tuple[list[Signal], list[Signal]]:
        """Per port: room for every outstanding response (a credit per response the
        pipeline and the FIFO can hold); the port may issue while it has one. Returns
        the ports' ``accept`` strobes (driven by :meth:`elaborate`) and ``can``."""
        accepts = [Signal(name=f"{name}_accept") for name in self.ports]
        can = []
        for p, name in enumerate(self.ports):
            credits = Signal(range(RESPONSE_CREDITS + 1), init=RESPONSE_CREDITS,
                             name=f"{name}_credits")
            resp = getattr(self, f"{name}_resp")
            popped = resp.valid & resp.ready
            m.d.sync += credits.eq(credits - accepts[p] + popped)
            can.append(Signal(name=f"{name}_can"))
            m.d.comb += can[-1].eq(credits != 0)
        return accepts, can

    def _banks(self, m: Module, fronts: list[dict], can: list[Signal]):
        """The bank memories and their per-bank round-robin arbitration: each bank does
        the one access of its granted port per cycle. Returns each bank's read word (a
        cycle after the read) and ``granted[bank][port]``."""
        code, nports = self.code, len(self.ports)
        reads, writes = [], []
        for b in range(self.banks):
            bank = memory.Memory(shape=code.code_bits, depth=self.depth, init=[])
            m.submodules[f"bank{b}"] = bank
            reads.append(bank.read_port())  # synchronous, not transparent
            writes.append(bank.write_port())
        # Each port's request as the banks see it: the word ECC-encoded once (not once
        # per bank), and the wish for bank b.
        encoded = [Signal(code.code_bits, name=f"{name}_encoded") for name in self.ports]
        for p, f in enumerate(fronts):
            m.d.comb += encoded[p].eq(_ecc.encode(code, f["data"]) ^ f["flip"])
        granted = [[Signal(name=f"grant_b{b}_{name}") for name in self.ports]
                   for b in range(self.banks)]
        for b in range(self.banks):
            wants = [Signal(name=f"want_b{b}_{name}") for name in self.ports]
            for p, f in enumerate(fronts):
                m.d.comb += wants[p].eq(f["valid"] & f["needs_bank"] & (f["bank"] == b) & can[p])
            last = Signal(range(nports), name=f"rr_b{b}")
            with m.Switch(last):
                for start in range(nports):
                    # The last case as Default: a complete case statement for any nports.
                    with (m.Case(start) if start < nports - 1 else m.Default()):
                        taken = C(0, 1)
                        for i in range(nports):
                            p = (start + 1 + i) % nports
                            m.d.comb += granted[b][p].eq(wants[p] & ~taken)
                            taken = taken | wants[p]
            for p in range(nports):
                with m.If(granted[b][p]):
                    m.d.sync += last.eq(p)
            read, write = reads[b], writes[b]
            m.d.comb += read.en.eq(0)
            for p, f in enumerate(fronts):
                with m.If(granted[b][p]):
                    m.d.comb += [
                        read.addr.eq(f["row"]),
                        read.en.eq(~f["write"]),
                        write.addr.eq(f["row"]),
                        write.data.eq(encoded[p]),
                        write.en.eq(f["write"]),
                    ]
        # The bank read data goes straight into a register (the EBR output register, or
        # a flip-flop placed next to the block RAM) and nowhere else: block-RAM
        # clock-to-output is too slow to feed logic at 100 MHz.
        bank_words = []
        for b, read in enumerate(reads):
            bank_word = Signal(code.code_bits, name=f"bank{b}_word")
            m.d.sync += bank_word.eq(read.data)
            bank_words.append(bank_word)
        return bank_words, granted

    def _pipeline(self, m: Module, name: str, f: dict, accept: Signal,
                  bank_words: list[Signal]) -> tuple:
        """One port's accepted request: s1 (bank read) -> s2 (bank word registered:
        select, syndrome) -> s3 (correct) -> its response FIFO. Returns the port's
        (corrected, uncorrectable) read events and whether a request is in its pipeline
        or a response in its FIFO."""
        code = self.code

        def stage(tag: str, valid, read, write, bank, status) -> tuple[Signal, ...]:
            """Registers of pipeline stage ``tag`` loaded from the stage before."""
            regs = (Signal(name=f"{name}_{tag}_valid"), Signal(name=f"{name}_{tag}_read"),
                    Signal(name=f"{name}_{tag}_write"),
                    Signal(range(self.banks), name=f"{name}_{tag}_bank"),
                    Signal(Status(), name=f"{name}_{tag}_status"))
            m.d.sync += [r.eq(v) for r, v in zip(regs, (valid, read, write, bank, status),
                                                 strict=True)]
            return regs

        s1 = stage("s1", accept, accept & f["needs_bank"] & ~f["write"], f["write"],
                   f["bank"], f["status"])
        s2_valid, s2_read, s2_write, s2_bank, s2_status = stage("s2", *s1)
        word = Signal(code.code_bits, name=f"{name}_s2_word")
        m.d.comb += word.eq(_lookup(bank_words, s2_bank))
        syn, parity = _ecc.syndrome(code, word)

        s3_valid = Signal(name=f"{name}_s3_valid")
        s3_read = Signal(name=f"{name}_s3_read")
        s3_write = Signal(name=f"{name}_s3_write")
        s3_word = Signal(code.code_bits, name=f"{name}_s3_word")
        s3_syn = Signal(code.hamming_bits, name=f"{name}_s3_syn")
        s3_parity = Signal(name=f"{name}_s3_parity")
        s3_status = Signal(Status(), name=f"{name}_s3_status")
        m.d.sync += [s3_valid.eq(s2_valid), s3_read.eq(s2_read), s3_write.eq(s2_write),
                     s3_status.eq(s2_status)]
        with m.If(s2_read):  # only a read's word is used (others answer zero)
            m.d.sync += [s3_word.eq(word), s3_syn.eq(syn), s3_parity.eq(parity)]
        fixed, corrected, uncorrectable = _ecc.correct(m, code, s3_word, s3_syn, s3_parity,
                                                       name=f"{name}_ecc")
        response = Signal(self.response_layout, name=f"{name}_response")
        m.d.comb += [
            response.data.eq(Mux(s3_read, fixed, 0)),
            response.write.eq(s3_write),
            response.status.eq(s3_status),
            response.status.corrected.eq(s3_read & corrected),
            response.status.uncorrectable.eq(s3_read & uncorrectable),
        ]

        queue = fifo.SyncFIFOBuffered(width=self.response_layout.size,
                                      depth=RESPONSE_CREDITS + 1)
        m.submodules[f"{name}_responses"] = queue
        resp = getattr(self, f"{name}_resp")
        m.d.comb += [
            queue.w_en.eq(s3_valid),
            queue.w_data.eq(response),
            resp.valid.eq(queue.r_rdy),
            resp.payload.eq(queue.r_data),
            queue.r_en.eq(resp.ready),
        ]
        in_flight = s1[0] | s2_valid | s3_valid | (queue.level != 0)
        return s3_valid & s3_read & corrected, s3_valid & s3_read & uncorrectable, in_flight

    def _ecc_counters(self, m: Module, corrected: list, uncorrectable: list) -> None:
        """Saturating counts of the ports' corrected and uncorrectable reads, and the
        sticky ``ecc_error``."""
        limit = (1 << COUNTER_BITS) - 1
        for counter, events in ((self.corrected_count, corrected),
                                (self.uncorrectable_count, uncorrectable)):
            total = sum(events)
            m.d.sync += counter.eq(Mux(counter + total >= limit, limit, counter + total))
        with m.If(Cat(*uncorrectable).any()):
            m.d.sync += self.ecc_error.eq(1)

    # --- port front ends ------------------------------------------------------------------

    def _front(self, name: str) -> dict:
        return {
            "valid": Signal(name=f"{name}_valid"),
            "ready": Signal(name=f"{name}_ready"),
            "needs_bank": Signal(name=f"{name}_needs_bank"),
            "bank": Signal(range(self.banks), name=f"{name}_bank"),
            "row": Signal(range(self.depth), name=f"{name}_row"),
            "write": Signal(name=f"{name}_write"),
            "data": Signal(self.word_bits, name=f"{name}_data"),
            "flip": Signal(self.code.code_bits, name=f"{name}_flip"),
            "status": Signal(Status(), name=f"{name}_status"),
        }

    def _plain_front(self, m: Module, name: str, req) -> dict:
        """Address check only, no register: a plain request is arbitrated as it arrives."""
        f = self._front(name)
        log_banks = _log2(self.banks)
        addr = req.payload.addr
        bad = addr >= self.words
        m.d.comb += [
            f["valid"].eq(req.valid),
            req.ready.eq(f["ready"]),
            f["needs_bank"].eq(~bad),
            f["bank"].eq(addr[:log_banks]),
            f["row"].eq(addr[log_banks:]),
            f["write"].eq(req.payload.write),
            f["data"].eq(req.payload.data),
            f["status"].bad_address.eq(bad),
        ]
        if self.fault_injection:
            m.d.comb += f["flip"].eq(req.payload.flip)
        return f

    def _kv_errors(self, m: Module, req_p, seq_ok, length, entry_mapped) -> dict:
        """A KV request's one error, if any (see :class:`Status`), by status field;
        separate signals, never constant."""
        op, pages = req_p.op, self.max_pages
        errors = {name: Signal(name=f"kv_{name}") for name in
                  ("bad_request", "bad_address", "kv_full", "unmapped", "bad_page")}
        checked = seq_ok & (req_p.word < self.token_words)
        # Plain expressions rather than a Switch on op: a signal set in only some cases of
        # a Switch becomes an incomplete Verilog case, which Verilator rejects.
        is_append, is_read = op == KvOp.APPEND, op == KvOp.READ
        is_map, is_reset = op == KvOp.MAP, op == KvOp.RESET
        page_ok = req_p.index < pages
        m.d.comb += [
            errors["bad_request"].eq(((is_append | is_read) & ~checked)
                                     | (is_map & ~(seq_ok & page_ok)) | (is_reset & ~seq_ok)),
            errors["kv_full"].eq(is_append & checked & (length >= self.capacity)),
            errors["bad_address"].eq(is_read & checked & (req_p.index >= length)),
            errors["unmapped"].eq(checked & ((is_append & (length < self.capacity))
                                             | (is_read & (req_p.index < length)))
                                  & ~entry_mapped),
            errors["bad_page"].eq(is_map & seq_ok & page_ok & (req_p.phys >= self.num_pages)),
        ]
        return errors

    def _kv_front(self, m: Module, req) -> dict:
        """One registered stage: check the request, translate it through the block table,
        update lengths and the table, and hand a plain access (or an error) on."""
        f = self._front("kv")
        log_banks, log_ps = _log2(self.banks), _log2(self.page_size)
        log_tw = _log2(self.token_words)
        seqs, pages = self.sequences, self.max_pages

        lengths = [Signal(range(self.capacity + 1), name=f"kv_len{s}") for s in range(seqs)]
        # The block table: a mapped bit per entry (a vector per sequence, so that RESET
        # clears a row at once) and the physical pages in a memory read asynchronously,
        # entry (s, p) at s * pages + p. An entry's page is read only while it is mapped,
        # and MAP writes it, so the memory needs no reset. (Entries as separate registers
        # made the simulator update every one of them on every cycle.)
        mapped = [Signal(pages, name=f"kv_map{s}") for s in range(seqs)]
        m.submodules.kv_table = table = memory.Memory(
            shape=range(self.num_pages), depth=seqs * pages, init=[])
        table_read = table.read_port(domain="comb")
        table_write = table.write_port()

        req_p = req.payload
        op = req_p.op
        seq_ok = req_p.seq < seqs
        seq = Signal.like(req_p.seq, name="kv_seq")
        m.d.comb += seq.eq(Mux(seq_ok, req_p.seq, 0))  # never index past the tables
        length = _lookup(lengths, seq)
        token = Signal(range(max(self.capacity, pages) + 1), name="kv_token")
        m.d.comb += token.eq(Mux(op == KvOp.APPEND, length, req_p.index))
        logical = token >> log_ps
        logical_ok = logical < pages
        logical_idx = Signal(range(pages), name="kv_logical")
        m.d.comb += logical_idx.eq(Mux(logical_ok, logical, 0))
        entry_mapped = _lookup(mapped, seq).bit_select(logical_idx, 1)
        m.d.comb += table_read.addr.eq(seq * pages + logical_idx)
        entry_phys = table_read.data

        is_append, is_read = op == KvOp.APPEND, op == KvOp.READ
        errors = self._kv_errors(m, req_p, seq_ok, length, entry_mapped)
        ok = ~Cat(*errors.values()).any()
        page = req_p.index[:_bits_for(pages - 1)]  # the entry a MAP that passed writes

        slot = token[:log_ps]
        addr = Signal(range(self.words), name="kv_addr")
        m.d.comb += addr.eq(self.kv_base + Cat(slot, req_p.word[:log_tw], entry_phys))

        # The stage register: holds one translated request until the pipeline takes it.
        valid = Signal(name="kv_stage_valid")
        take = req.valid & req.ready
        m.d.comb += [
            req.ready.eq(~valid | f["ready"]),
            f["valid"].eq(valid),
        ]
        with m.If(f["ready"]):
            m.d.sync += valid.eq(0)
        with m.If(take):
            is_access = is_append | is_read
            m.d.sync += [
                valid.eq(1),
                f["needs_bank"].eq(ok & is_access),
                f["bank"].eq(addr[:log_banks]),
                f["row"].eq(addr[log_banks:]),
                f["write"].eq(op == KvOp.APPEND),
                f["data"].eq(req_p.data),
                *(f["status"][name].eq(flag) for name, flag in errors.items()),
            ]
            # Lengths and the block table change only for a request that passed.
            for s in range(seqs):
                here = ok & (seq == s)
                with m.If(here & (op == KvOp.APPEND) & req_p.last):
                    m.d.sync += lengths[s].eq(lengths[s] + 1)
                with m.If(here & (op == KvOp.RESET)):
                    m.d.sync += [lengths[s].eq(0), mapped[s].eq(0)]
                with m.If(here & (op == KvOp.MAP)):
                    m.d.sync += mapped[s].eq(mapped[s] | (C(1, pages) << page)[:pages])
        m.d.comb += [
            table_write.addr.eq(seq * pages + page),
            table_write.data.eq(req_p.phys),
            table_write.en.eq(take & ok & (op == KvOp.MAP)),
        ]
        return f
