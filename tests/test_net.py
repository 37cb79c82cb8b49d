"""The net collector: the pcap reader on written captures, and a real loopback transfer."""

from __future__ import annotations

import socket
import struct
import sys
import textwrap
from pathlib import Path

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from perfswarm.errors import TraceFormatError
from perfswarm.recorder import net
from perfswarm.recorder.session import RecordOptions, record
from perfswarm.trace.readers import pcap

PY = sys.executable
MS = 1_000_000


def _ipv4(proto: int, src: str, dst: str, l4: bytes, payload: int) -> bytes:
    total = 20 + len(l4) + payload
    return (struct.pack(">BBHHHBBH4s4s", 0x45, 0, total, 0, 0, 64, proto, 0,
                        socket.inet_aton(src), socket.inet_aton(dst)) + l4)


def _ipv6(proto: int, src: str, dst: str, l4: bytes, payload: int) -> bytes:
    return (struct.pack(">IHBB16s16s", 6 << 28, len(l4) + payload, proto, 64,
                        socket.inet_pton(socket.AF_INET6, src),
                        socket.inet_pton(socket.AF_INET6, dst)) + l4)


def _tcp(sport: int, dport: int, options: int = 12) -> bytes:
    return struct.pack(">HHIIBBHHH", sport, dport, 0, 0, (5 + options // 4) << 4, 0x18, 65535,
                       0, 0) + b"\x01" * options


def _udp(sport: int, dport: int, payload: int) -> bytes:
    return struct.pack(">HHHH", sport, dport, 8 + payload, 0)


def _sll2(ip: bytes, loopback: bool = False, outgoing: bool = False) -> bytes:
    ethertype = 0x0800 if ip[0] >> 4 == 4 else 0x86DD
    return struct.pack(">HHIHBB8s", ethertype, 0, 1 if loopback else 2,
                       pcap.ARPHRD_LOOPBACK if loopback else 1,
                       pcap.PACKET_OUTGOING if outgoing else 0, 6, b"") + ip


def _pcap(packets: list[tuple[int, bytes, int]], linktype: int = 276, nano: bool = True,
          order: str = "<") -> bytes:
    """A capture of (ts_ns, frame headers, bytes beyond them) cut at net.SNAPLEN, as tcpdump
    -s writes it."""
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out = struct.pack(order + "IHHiIII", magic, 2, 4, 0, 0, net.SNAPLEN, linktype)
    for ts, frame, beyond in packets:
        frac = ts % 1_000_000_000 if nano else ts % 1_000_000_000 // 1000
        kept = frame[:net.SNAPLEN]
        out += struct.pack(order + "IIII", ts // 1_000_000_000, frac, len(kept),
                           len(frame) + beyond) + kept
    return out


def test_read_pcap_flows_and_loopback_once(tmp_path: Path) -> None:
    t = 1_700_000_000_000_000_000
    v4 = _ipv4(6, "127.0.0.1", "127.0.0.1", _tcp(40000, 5000), 1000)
    v6 = _ipv6(17, "::1", "fe80::2", _udp(53, 9999, 300), 300)
    data = _pcap([
        (t, _sll2(v4, loopback=True, outgoing=True), 1000),  # lo's outgoing copy: skipped
        (t + 10, _sll2(v4, loopback=True), 1000),
        (t + 20, _sll2(_ipv4(1, "10.0.0.1", "10.0.0.2", b"\x08\0\0\0\0\0\0\0", 56),
                       outgoing=True), 56),  # a real interface's outgoing packet counts
        (t + 30, _sll2(v6), 300),
    ]) + b"\x00" * 9  # a record cut off by a crash ends the file
    packets = list(pcap.read_pcap(data, tmp_path / "x.pcap"))
    assert packets == [
        pcap.Packet(t + 10, "tcp", "127.0.0.1", 40000, "127.0.0.1", 5000, 1000),
        pcap.Packet(t + 20, "icmp", "10.0.0.1", -1, "10.0.0.2", -1, 64),
        pcap.Packet(t + 30, "udp", "[::1]", 53, "[fe80::2]", 9999, 300),
    ]
    assert [pcap.flow_name(p) for p in packets] == [
        "net.flow.tcp.127.0.0.1:40000->127.0.0.1:5000", "net.flow.icmp.10.0.0.1->10.0.0.2",
        "net.flow.udp.[::1]:53->[fe80::2]:9999"]


def test_read_pcap_formats_and_errors(tmp_path: Path) -> None:
    ip = _ipv4(17, "1.2.3.4", "5.6.7.8", _udp(1, 2, 10), 10)
    ethernet = b"\0" * 12 + b"\x08\x00" + ip
    for data in (_pcap([(5_000_000_000, ethernet, 10)], linktype=1, nano=False, order=">"),
                 _pcap([(5_000_000_000, ip, 10)], linktype=101)):
        (p,) = pcap.read_pcap(data, tmp_path / "x.pcap")
        assert (p.ts_ns, p.src, p.dport, p.payload) == (5_000_000_000, "1.2.3.4", 2, 10)
    assert list(pcap.read_pcap(b"\xd4\xc3", tmp_path / "x.pcap")) == []  # header never written
    with pytest.raises(TraceFormatError, match=r"x.pcap \(byte 0\): not a pcap file"):
        list(pcap.read_pcap(b"\x0a\x0d\x0d\x0a" + b"\0" * 40, tmp_path / "x.pcap"))
    with pytest.raises(TraceFormatError, match="link type 147 is not supported"):
        list(pcap.read_pcap(_pcap([], linktype=147), tmp_path / "x.pcap"))


@given(st.lists(st.tuples(st.integers(0, 2_000_000_000), st.sampled_from([6, 17]),
                          st.integers(1, 3), st.integers(0, 60_000), st.booleans()),
                max_size=40))
@example([(0, 6, 1, 100, False), (1_000_000, 6, 1, 0, False)])  # data, then the close's ACK
def test_flow_totals_are_the_payload_sums(sent: list[tuple[int, int, int, int, bool]]) -> None:
    """Whatever the segmentation and timing, each flow's last point is the bytes it carried;
    points are in time order, never decrease, and one per flow and interval."""
    frames, expected = [], {}
    base = 1_800_000_000_000_000_000
    for offset, proto, port, payload, v6 in sorted(sent):
        l4 = _tcp(port, 80) if proto == 6 else _udp(port, 80, payload)
        ip = (_ipv6(proto, "::1", "::2", l4, payload) if v6
              else _ipv4(proto, "10.1.1.1", "10.1.1.2", l4, payload))
        frames.append((base + offset, _sll2(ip), payload))
        p = next(pcap.read_pcap(_pcap(frames[-1:]), Path("x.pcap")))
        expected[pcap.flow_name(p)] = expected.get(pcap.flow_name(p), 0) + payload
    rows = pcap.flow_rows(pcap.read_pcap(_pcap(frames), Path("x.pcap")), 50 * MS)
    by_flow: dict[str, list[tuple[int, float]]] = {}
    for ts, name, device, value in sorted(rows):
        assert device == -1
        if name.endswith(".bytes"):
            by_flow.setdefault(name.removesuffix(".bytes"), []).append((ts, value))
    assert {f: points[-1][1] for f, points in by_flow.items()} == expected
    # a total is stamped with the packet that brought it (the last payload of its interval)
    carried = {base + offset for offset, _, _, payload, _ in sent if payload}
    for points in by_flow.values():
        grew = [ts for (ts, v), before in zip(points, [0.0, *(v for _, v in points[:-1])],
                                              strict=True) if v > before]
        assert set(grew) <= carried
        values = [v for _, v in points]
        assert values == sorted(values)
        intervals = [ts // (50 * MS) for ts, _ in points]
        assert len(set(intervals)) == len(intervals)


LOOPBACK = textwrap.dedent("""
    import json, socket, sys, threading, time
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
    marks = {"port": srv.getsockname()[1]}
    def serve():
        conn, _ = srv.accept(); got = 0
        while got < 300_000:
            got += len(conn.recv(65536))
            if got >= 100_000 and "recv_a" not in marks:
                marks["recv_a"] = time.time_ns()
        marks["recv_b"] = time.time_ns(); conn.close()
    server = threading.Thread(target=serve); server.start()
    s = socket.create_connection(("127.0.0.1", marks["port"]))
    marks["client_port"] = s.getsockname()[1]
    time.sleep(0.2)
    marks["a0"] = time.time_ns(); s.sendall(b"a" * 100_000)
    time.sleep(0.3)
    marks["b0"] = time.time_ns(); s.sendall(b"b" * 200_000)
    server.join(); s.close()
    open(sys.argv[1], "w").write(json.dumps(marks))
""")


def test_net_counts_a_loopback_transfer_on_the_run_clock(tmp_path: Path) -> None:
    """100,000 then 200,000 bytes over a loopback TCP socket: the flow's byte counter steps to
    exactly those totals, each step stamped between the send and the receiver having it all."""
    marks_path = tmp_path / "marks.json"
    result = record([PY, "-c", LOOPBACK, str(marks_path)], tmp_path / "n.run",
                    RecordOptions(collectors=("net",)))
    m = result.run.manifest()
    status = m["collectors"]["net"]["status"]
    if status != "ok":
        pytest.skip(f"net {status}")
    assert result.exit_code == 0 and m["clock_offsets"]["net"] == 0
    assert set(m["collectors"]["net"]["files"]) == {"net.pcap", "net.log"}
    marks = orjson.loads(marks_path.read_bytes())
    flow = f"net.flow.tcp.127.0.0.1:{marks['client_port']}->127.0.0.1:{marks['port']}"
    c = result.run.table("counters").to_pydict()
    points = [(ts, v) for ts, n, v in zip(c["ts"], c["name"], c["value"], strict=True)
              if n == flow + ".bytes"]
    assert points and points[-1][1] == 300_000.0
    (a,) = [ts for ts, v in points if v == 100_000.0]
    assert marks["a0"] - MS <= a <= marks["recv_a"] + MS
    # the total's first point; the close's empty packets (FIN, ACK), when they fall in a later
    # interval, give the flow another point there at the same total
    b = min(ts for ts, v in points if v == 300_000.0)
    assert marks["b0"] - MS <= b <= marks["recv_b"] + MS
    assert all(v == 0.0 for ts, v in points if ts < marks["a0"] - MS)  # the handshake
    assert not [v for ts, v in points if marks["recv_a"] + MS < ts < marks["b0"] - MS]
    back = f"net.flow.tcp.127.0.0.1:{marks['port']}->127.0.0.1:{marks['client_port']}"
    acks = [v for n, v in zip(c["name"], c["value"], strict=True) if n == back + ".packets"]
    assert acks and acks[-1] >= 3  # SYN-ACK and ACKs, no payload
