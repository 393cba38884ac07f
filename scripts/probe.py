#!/usr/bin/env python3
"""Hostile-user probe of the tensortune CLI (issue 19).

Usage: python3 scripts/probe.py [--bin PATH] [--quick] [--timeout SECS] [--only CATEGORY]

Runs some 600 commands (about 100 with --quick) against the binary, each in a fresh
temporary folder holding copies of the fixtures (good and hostile databases, import files,
.npy files), each under a timeout, pinned with `taskset -c 1` when taskset works, and
classifies each:

  ok          exit 0
  user-error  exit 2 with exactly one line on stderr (clap's "error" line followed by
              "For more information, try '--help'." also counts as one, and so does
              `import`'s documented report: a `FILE:LINE: why` line per bad line and one
              `tensortune: ... bad line(s) ...` summary)
  internal    exit 1 (or any other exit status that is not a signal): a defect
  PANIC       "panicked" on stderr, or exit 101
  ABORT       killed by a signal, exit 134/139, or "memory allocation of" on stderr
  HANG        still running at the timeout (killed with its process group)
  MULTILINE   exit 2 with more than one line on stderr (other than clap's form)
  DATA-LOSS   a database the command should only read changed (sha256 of the file and its
              WAL), or a database it writes lost records (count before > count after)
  OTHER       a case-specific expectation failed: an invalid input accepted (exit 0), a
              valid one refused, `<script>` markup unescaped in HTML/SVG output, a fault
              plan that did not yield its error records, --strict importing something

Prints a markdown table per category and every defect with its command line and the first
200 characters of its stderr. Exit status: 0 without defects, 1 with any, 2 on bad usage.
Standard library only.
"""

import argparse
import hashlib
import json
import os
import stat
import random
import re
import shlex
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time

DEFAULT_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target",
                           "release", "tensortune")

CATEGORIES = [
    ("specs", "1. workload specs"),
    ("numeric", "2. numeric flags"),
    ("targets", "3. targets"),
    ("databases", "4. databases"),
    ("imports", "5. import files and merges"),
    ("outputs", "6. output paths"),
    ("env", "7. environment"),
    ("npy", "8. .npy inputs"),
]

W = "matmul:M=3,N=5,K=7"           # the workload tuned into good.db
WS = "softmax:M=4,N=8"              # the second one
TUNE_FAST = ["--trials", "2", "--batch-size", "2", "--population", "16"]
RUN_FAST = ["--repeat", "1", "--min-repeat-ms", "1"]
MARKUP = "<script>alert(1)</script>"


class Case:
    def __init__(self, cat, args, env=None, stdin=None, ro=(), rw=(), expect=None,
                 check=None, timeout=None, lock=None, note=""):
        self.cat = cat
        self.args = list(args)
        self.env = env or {}
        self.stdin = stdin
        self.ro = list(ro)          # databases the command must not change
        self.rw = list(rw)          # databases the command may write but must not shrink
        self.expect = expect        # None, "ok" (exit 0) or "err" (exit 2)
        self.check = check          # fn(dir, rc, stdout, stderr) -> [problem strings]
        self.timeout = timeout
        self.lock = lock            # a database to hold an exclusive lock on meanwhile
        self.note = note

    def cmdline(self):
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        text = " ".join(shlex.quote(a) for a in ["tensortune"] + self.args)
        if self.stdin is not None:
            text += f" < ({len(self.stdin)} bytes on stdin)"
        return (env + " " + text).strip()


# --------------------------------------------------------------------------- fixtures

def sh(cmd, cwd, env=None, check=True):
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True)
    if check and p.returncode != 0:
        raise SystemExit(f"probe: fixture command failed ({p.returncode}): {cmd}\n"
                         f"{p.stderr.decode(errors='replace')}")
    return p


def npy_bytes(descr, shape, data, fortran=False, header=None, version=(1, 0)):
    if header is None:
        header = ("{'descr': '%s', 'fortran_order': %s, 'shape': %s, }"
                  % (descr, "True" if fortran else "False", shape))
    hb = header.encode("latin1") if isinstance(header, str) else header
    if version[0] == 1:
        pad = 64 - (10 + len(hb) + 1) % 64
        hb = hb + b" " * (pad % 64) + b"\n"
        head = b"\x93NUMPY" + bytes(version) + struct.pack("<H", len(hb))
    else:
        pad = 64 - (12 + len(hb) + 1) % 64
        hb = hb + b" " * (pad % 64) + b"\n"
        head = b"\x93NUMPY" + bytes(version) + struct.pack("<I", len(hb))
    return head + hb + data


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def build_fixtures(bin_path, fx, pin):
    """Writes every fixture into fx; returns the host target key."""
    env = clean_env()
    good = os.path.join(fx, "good.db")
    base = pin + [bin_path, "-q"]
    sh(base + ["tune", "--workload", W, "--trials", "8", "--batch-size", "4",
               "--population", "16", "--db", good], fx, env)
    sh(base + ["tune", "--workload", WS, "--trials", "4", "--batch-size", "4",
               "--population", "16", "--db", good], fx, env)
    for side in ("-wal", "-shm"):
        if os.path.exists(good + side):
            raise SystemExit("probe: good.db left a " + side + " file behind")
    con = sqlite3.connect(good)
    host = con.execute("SELECT target_key FROM records LIMIT 1").fetchone()[0]
    con.close()
    with open(os.path.join(fx, "good.jsonl"), "wb") as f:
        f.write(sh([bin_path, "export", "--db", good], fx, env).stdout)
    rng = random.Random(19)
    gb = open(good, "rb").read()
    open(os.path.join(fx, "empty.db"), "wb").close()
    open(os.path.join(fx, "random.db"), "wb").write(bytes(rng.randrange(256) for _ in range(8192)))
    open(os.path.join(fx, "text.db"), "w").write("this is not a database\n" * 100)
    open(os.path.join(fx, "trunc.db"), "wb").write(gb[: len(gb) // 2])
    open(os.path.join(fx, "trunc100.db"), "wb").write(gb[:100])
    open(os.path.join(fx, "header.db"), "wb").write(b"SQLite format 3\x00" + b"\xff" * 200)
    os.mkdir(os.path.join(fx, "adir.db"))
    os.mkdir(os.path.join(fx, "adir"))

    def variant(name, sqls, params=()):
        path = os.path.join(fx, name)
        shutil.copyfile(good, path)
        c = sqlite3.connect(path)
        for sql in sqls:
            if isinstance(sql, tuple):
                c.execute(*sql)
            else:
                c.executescript(sql)
        c.commit()
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        c.close()
        for side in ("-wal", "-shm"):
            if os.path.exists(path + side):
                os.remove(path + side)

    variant("newer.db", ["PRAGMA user_version = 99;"])
    variant("older.db", ["PRAGMA user_version = 1;"])
    variant("v0.db", ["PRAGMA user_version = 0;"])
    variant("negver.db", ["PRAGMA user_version = -5;"])
    other = os.path.join(fx, "other.db")
    c = sqlite3.connect(other)
    c.executescript("CREATE TABLE foo (x); INSERT INTO foo VALUES (1);")
    c.close()
    c = sqlite3.connect(os.path.join(fx, "blank.db"))   # a valid SQLite file, no tables
    c.execute("PRAGMA user_version = 0")
    c.close()
    c = sqlite3.connect(os.path.join(fx, "norecords.db"))  # tables of another shape
    c.executescript("CREATE TABLE workloads (id INTEGER PRIMARY KEY, key TEXT);"
                    "CREATE TABLE records (id INTEGER PRIMARY KEY, x TEXT);"
                    "PRAGMA user_version = 2;")
    c.close()

    wid = "(SELECT id FROM workloads WHERE key = 'matmul:K=7,M=3,N=5,dtype=f32')"
    trace = sqlite3.connect(good).execute(
        "SELECT trace FROM records WHERE error_kind IS NULL LIMIT 1").fetchone()[0]
    counter = [0]

    def rec(median, trace_=None, target=None, wl=wid, repeats=3, mn=None, mx=None,
            kind=None, msg=None, run="1", thash="00"):
        counter[0] += 1
        t = trace if trace_ is None else trace_
        tk = host if target is None else target
        return (("INSERT INTO records (uid, workload_id, target_key, trace, trace_hash, "
                 "median_s, min_s, max_s, repeats, error_kind, error_message, measured_at, "
                 f"run_id) VALUES (?, {wl}, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                 f"'2026-12-03T00:00:00.000Z', {run})"),
                (f"hostile{counter[0]}", tk, t, thash, median,
                 median if mn is None else mn, median if mx is None else mx,
                 repeats if kind is None else None, kind, msg))

    variant("hostile_lat.db", [
        rec(-1.0), rec(0.0), rec(1e-300), rec(1e300), rec(float("inf")),
        rec(float("-inf")), rec("NaN"), rec("abc"), rec(1e-6, repeats=-5),
        rec(1e-6, repeats=0), rec(1e-6, mn=5.0, mx=1e-9), rec(5e-324),
        rec(None, kind="runtime", msg=None), rec(None, kind="other", msg=""),
    ])
    deep = "[" * 100000 + "]" * 100000
    variant("hostile_trace.db", [
        rec(1e-12, "not json"), rec(2e-12, ""), rec(3e-12, "{}"), rec(4e-12, "[]"),
        rec(5e-12, '{"steps": 5}'), rec(6e-12, "null"),
        rec(7e-12, '{"steps":[{"op":"split","stage":999,"iter":0,"factors":[0]}]}'),
        rec(8e-12, '{"steps":[{"op":"split","stage":2,"iter":0,"factors":[-1]}]}'),
        rec(9e-12, '{"steps":[{"op":"split","stage":2,"iter":0,'
                   '"factors":[99999999999999999999]}]}'),
        rec(1e-11, '{"steps":[{"op":"split","stage":2,"iter":0,"factors":[3,3,3,3,3]}]}'),
        rec(1.1e-11, '{"steps":[{"op":"annotate","stage":2,"iter":77,'
                     '"annotation":"vectorize"}]}'),
        rec(1.2e-11, '{"steps":[{"op":"reorder","stage":2,"order":[0,0,0]}]}'),
        rec(1.3e-11, '{"steps":[{"op":"compute_at","stage":2,"target":2,"iter":0}]}'),
        rec(1.4e-11, '{"steps":[{"op":"launch_missiles"}]}'),
        rec(1.5e-11, deep),
        rec(1.6e-11, '{"steps":[{"op":"auto_unroll","stage":3,"iter":0,'
                     '"max_step":1000000000}]}'),
        rec(1.7e-11, '{"steps":[{"op":"split","stage":2,"iter":0,"factors":[1e308]}]}'),
    ])
    variant("hostile_keys.db", [
        ("INSERT INTO workloads (key, flops, op) VALUES (?, 1.0, 'matmul')", (MARKUP,)),
        "INSERT INTO workloads (key, flops, op) VALUES ('bogus:X=1', 1.0, 'bogus');",
        "INSERT INTO workloads (key, flops, op) VALUES "
        "('matmul:K=0,M=0,N=0,dtype=f32', 0.0, 'matmul');",
        "INSERT INTO workloads (key, flops, op) VALUES "
        "('matmul:K=2,M=2,N=2,dtype=f32', -1.0, 'matmul');",
        "INSERT INTO workloads (key, flops, op) VALUES ('', 1e308, '');",
        "INSERT INTO workloads (key, flops, op) VALUES "
        "('softmax:M=4,N=8,dtype=f99', 'x', 'softmax');",
        rec(1e-6, wl=f"(SELECT id FROM workloads WHERE key = '{MARKUP}')"),
        rec(1e-6, wl="(SELECT id FROM workloads WHERE key = 'bogus:X=1')"),
        rec(1e-6, wl="(SELECT id FROM workloads WHERE key = 'matmul:K=0,M=0,N=0,dtype=f32')"),
        rec(1e-6, wl="(SELECT id FROM workloads WHERE key = 'matmul:K=2,M=2,N=2,dtype=f32')"),
        rec(1e-6, wl="(SELECT id FROM workloads WHERE key = '')"),
        rec(1e-6, wl="(SELECT id FROM workloads WHERE key = 'softmax:M=4,N=8,dtype=f99')"),
        rec(1e-6, target=MARKUP), rec(1e-6, target=""), rec(1e-6, target="llvm\n-mcpu=x"),
        rec(1e-6, target="cuda -arch=sm_90"),
        rec(None, kind="compile", msg=MARKUP + "\n\x1b[31mred\x1b[0m"),
        ("UPDATE runs SET options = ?, tool_version = ?", (MARKUP, MARKUP)),
    ])
    variant("hostile_huge.db", [
        rec(None, kind="other", msg="E" * 1_000_000),
        rec(2e-6, target="llvm " + "x" * 100_000),
        ("INSERT INTO workloads (key, flops, op) VALUES (?, 1.0, 'matmul')",
         ("matmul:" + "M=1," * 25_000 + "K=1,N=1",)),
        rec(1e-6, wl="(SELECT max(id) FROM workloads)"),
        rec(3e-6, '{"steps":[' + ",".join(['{"op":"split","stage":2,"iter":0,"factors":[1]}']
                                          * 50_000) + ']}'),
    ])
    variant("hostile_ref.db", [
        rec(1e-6, wl="9999"), rec(1e-6, run="9999"), rec(1e-6, run="NULL"),
        rec(1e-6, thash="not-the-hash"),
        "DELETE FROM runs;",
    ])
    variant("hostile_all.db", [
        rec(-1.0), rec(0.0), rec("NaN"), rec(1e-12, "not json"), rec(2e-12, deep),
        rec(1e-6, target=MARKUP), rec(1e-6, wl="9999"),
        ("INSERT INTO workloads (key, flops, op) VALUES (?, 1.0, 'matmul')", (MARKUP,)),
        "PRAGMA user_version = 2;",
    ])
    os.symlink("good.db", os.path.join(fx, "link.db"))
    os.symlink("nowhere.db", os.path.join(fx, "dangling.db"))

    # import files
    lines = open(os.path.join(fx, "good.jsonl")).read().splitlines()
    one = json.loads(lines[0])
    for l in lines:
        if "result" in json.loads(l):
            one = json.loads(l)
            break

    def mutated(**changes):
        r = json.loads(json.dumps(one))
        for k, v in changes.items():
            if v is DELETE:
                r.pop(k, None)
            else:
                r[k] = v
        return json.dumps(r)

    def result(**kw):
        res = dict(one["result"])
        res.update(kw)
        return res

    imports = {
        "good": "\n".join(lines) + "\n",
        "empty": "",
        "newlines": "\n\n\n",
        "spaces": "   \n\t\n",
        "obj": "{}\n",
        "arr": "[]\n",
        "null": "null\n",
        "num": "42\n",
        "str": '"a string"\n',
        "trunc": lines[0][: len(lines[0]) // 2] + "\n",
        "mixed": lines[0] + "\nthis is garbage\n" + lines[1] + "\n",
        "bom": "\ufeff" + "\n".join(lines) + "\n",
        "crlf": "\r\n".join(lines) + "\r\n",
        "neg": mutated(result=result(median_s=-1.0, min_s=-1.0, max_s=-1.0)) + "\n",
        "zero": mutated(result=result(median_s=0.0, min_s=0.0, max_s=0.0)) + "\n",
        "tiny": mutated(result=result(median_s=1e-300, min_s=1e-300, max_s=1e-300)) + "\n",
        "overflow": mutated(result=result(median_s=1.0)).replace('"median_s": 1.0',
                                                                  '"median_s": 1e400') + "\n",
        "nan": mutated(result=result(median_s=1.0)).replace('"median_s": 1.0',
                                                             '"median_s": NaN') + "\n",
        "inf": mutated(result=result(median_s=1.0)).replace('"median_s": 1.0',
                                                             '"median_s": Infinity') + "\n",
        "minmax": mutated(result=result(median_s=1e-6, min_s=1.0, max_s=1e-9)) + "\n",
        "rep0": mutated(result=result(repeats=0)) + "\n",
        "repneg": mutated(result=result(repeats=-3)) + "\n",
        "repbig": mutated(result=result(repeats=2 ** 70)) + "\n",
        "both": mutated(result=result(), error={"kind": "runtime", "message": "x"}) + "\n",
        "noresult": mutated(result=DELETE) + "\n",
        "badkind": mutated(result=DELETE, error={"kind": "explode", "message": "x"}) + "\n",
        "tracestr": mutated(trace="not a trace") + "\n",
        "notrace": mutated(trace=DELETE) + "\n",
        "badtrace": mutated(trace={"steps": [{"op": "split", "stage": 999, "iter": 0,
                                              "factors": [0]}]}) + "\n",
        "format": mutated(format="tensortune.record/999") + "\n",
        "unknownop": mutated(workload="bogus:X=1") + "\n",
        "zeroext": mutated(workload="matmul:K=0,M=0,N=0,dtype=f32") + "\n",
        "flopsneg": mutated(flops=-5.0) + "\n",
        "markup": mutated(target=MARKUP, workload=MARKUP) + "\n",
        "unicode": mutated(target="llvm -mcpu=\u00e9\u4e2d\u6587\U0001f600") + "\n",
        "hash": mutated(trace_hash="0" * 64) + "\n",
        "when": mutated(measured_at="yesterday") + "\n",
        "norun": mutated(run=DELETE) + "\n",
        "runbad": mutated(run={"uid": 5}) + "\n",
        "extra": mutated(surprise={"nested": [1, 2, 3]}) + "\n",
        "dup": (lines[0] + "\n") * 1000,
        "huge": mutated(target="llvm " + "x" * 10_000_000) + "\n",
        "deep": "[" * 200000 + "]" * 200000 + "\n",
        "deepobj": '{"a":' * 100000 + "1" + "}" * 100000 + "\n",
        "longnum": mutated(flops=1.0).replace('"flops": 1.0', '"flops": ' + "9" * 100000) + "\n",
    }
    for name, text in imports.items():
        open(os.path.join(fx, f"imp_{name}.jsonl"), "w", encoding="utf-8").write(text)
    open(os.path.join(fx, "imp_binary.jsonl"), "wb").write(
        bytes(rng.randrange(256) for _ in range(65536)))
    open(os.path.join(fx, "imp_nul.jsonl"), "wb").write(lines[0].encode() + b"\x00\n")
    open(os.path.join(fx, "imp_latin1.jsonl"), "wb").write(
        lines[0].replace('"tensortune.record/1"', '"tensortune.record/1\xe9"').encode("latin1")
        + b"\n")

    # .npy files for matmul:M=2,N=2,K=2 (A[2,2], B[2,2])
    good2 = f32([1, 2, 3, 4])
    npys = {
        "a": npy_bytes("<f4", "(2, 2)", good2),
        "b": npy_bytes("<f4", "(2, 2)", good2),
        "be": npy_bytes(">f4", "(2, 2)", struct.pack(">4f", 1, 2, 3, 4)),
        "nan": npy_bytes("<f4", "(2, 2)", f32([float("nan"), float("inf"), -0.0, 1e38])),
        "trunc": npy_bytes("<f4", "(2, 2)", good2)[:-5],
        "trunchead": npy_bytes("<f4", "(2, 2)", good2)[:20],
        "f8": npy_bytes("<f8", "(2, 2)", struct.pack("<4d", 1, 2, 3, 4)),
        "i4": npy_bytes("<i4", "(2, 2)", struct.pack("<4i", 1, 2, 3, 4)),
        "u1": npy_bytes("|u1", "(2, 2)", b"\x01\x02\x03\x04"),
        "c8": npy_bytes("<c8", "(2, 2)", b"\x00" * 32),
        "obj": npy_bytes("|O", "(2, 2)", b"\x00" * 32),
        "str": npy_bytes("<U4", "(2, 2)", b"\x00" * 64),
        "f2": npy_bytes("<f2", "(2, 2)", b"\x00" * 8),
        "shape33": npy_bytes("<f4", "(3, 3)", f32([1] * 9)),
        "shape4": npy_bytes("<f4", "(4,)", good2),
        "shape0d": npy_bytes("<f4", "()", f32([1])),
        "shape221": npy_bytes("<f4", "(2, 2, 1)", good2),
        "shape02": npy_bytes("<f4", "(0, 2)", b""),
        "extra": npy_bytes("<f4", "(2, 2)", good2 + b"\x00" * 64),
        "huge": npy_bytes("<f4", "(99999999999, 99999999999)", good2),
        "overflow": npy_bytes("<f4", "(18446744073709551615, 18446744073709551615)", good2),
        "negshape": npy_bytes("<f4", "(-1, 4)", good2),
        "fortran": npy_bytes("<f4", "(2, 2)", good2, fortran=True),
        "nodescr": npy_bytes(None, None, good2, header="{'fortran_order': False, 'shape': (2, 2), }"),
        "garbage": npy_bytes(None, None, good2, header="import os; os.system('rm -rf /')"),
        "strshape": npy_bytes(None, None, good2,
                              header="{'descr': '<f4', 'fortran_order': False, 'shape': 'abc', }"),
        "nested": npy_bytes(None, None, good2,
                            header="{'descr': '<f4', 'fortran_order': False, 'shape': ((2,), 2), }"),
        "longhead": npy_bytes(None, None, good2,
                              header="{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), "
                                     "'x': '" + "y" * 10000 + "', }"),
        "v2": npy_bytes("<f4", "(2, 2)", good2, version=(2, 0)),
        "v3": npy_bytes("<f4", "(2, 2)", good2, version=(3, 0)),
        "v9": npy_bytes("<f4", "(2, 2)", good2, version=(9, 9)),
        "badmagic": b"\x93NUMPZ" + npy_bytes("<f4", "(2, 2)", good2)[6:],
        "hlenbig": npy_bytes("<f4", "(2, 2)", good2)[:8] + b"\xff\xff"
                   + npy_bytes("<f4", "(2, 2)", good2)[10:],
        "hlen0": npy_bytes("<f4", "(2, 2)", good2)[:8] + b"\x00\x00"
                 + npy_bytes("<f4", "(2, 2)", good2)[10:],
        "unicodehead": npy_bytes(None, None, good2,
                                 header="{'descr': '<f4', 'fortran_order': False, "
                                        "'shape': (2, 2), '\u00e9': 1, }".encode("utf-8")),
        "empty": b"",
        "text": b"1 2\n3 4\n",
    }
    for name, data in npys.items():
        open(os.path.join(fx, f"{name}.npy"), "wb").write(data)
    os.mkdir(os.path.join(fx, "dir.npy"))
    return host


class _Delete:
    pass


DELETE = _Delete()


# --------------------------------------------------------------------------- checks

def db_files(path):
    return [p for p in (path, path + "-wal") if os.path.isfile(p)]


def db_state(path):
    """(sha256 of the file and a non-empty WAL, record count or None), or None if absent."""
    real = os.path.realpath(path)
    if not os.path.isfile(real):
        return None
    h = hashlib.sha256()
    for p in db_files(real):
        if p.endswith("-wal") and os.path.getsize(p) == 0:
            continue
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest(), record_count(real)


def record_count(real):
    scratch = tempfile.mkdtemp(prefix="probe-count-")
    try:
        copy = os.path.join(scratch, "c.db")
        shutil.copyfile(real, copy)
        if os.path.isfile(real + "-wal"):
            shutil.copyfile(real + "-wal", copy + "-wal")
        con = sqlite3.connect(copy)
        try:
            return con.execute("SELECT count(*) FROM records").fetchone()[0]
        finally:
            con.close()
    except Exception:
        return None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def error_records(path):
    try:
        con = sqlite3.connect(path)
        n = con.execute("SELECT count(*) FROM records WHERE error_kind IS NOT NULL").fetchone()[0]
        t = con.execute("SELECT count(*) FROM records").fetchone()[0]
        con.close()
        return n, t
    except Exception as e:
        return None, str(e)


def stderr_lines(err):
    return [l for l in err.splitlines() if l.strip()]


def is_clap_form(lines):
    return len(lines) == 2 and lines[1].startswith("For more information, try")


def is_import_report(lines):
    """The documented reports of `import` (one `FILE:LINE: why` line per bad line) and
    `merge` (one `DB: record ID: why` line per bad record), each with one summary line."""
    summary = [l for l in lines if l.startswith("tensortune: ")]
    rest = [l for l in lines if not l.startswith("tensortune: ")]
    if len(summary) != 1 or not rest:
        return False
    if "bad line" in summary[0]:
        return all(re.match(r"^\s*\S+:\d+: ", l) for l in rest)
    if "bad record" in summary[0]:
        return all(re.match(r"^\S+: record \S+: ", l) for l in rest)
    return False


def classify(rc, timed_out, out, err):
    """Returns (base class, [defect kinds])."""
    if timed_out:
        return "hang", ["HANG"]
    kinds = []
    if "panicked" in err or rc == 101:
        kinds.append("PANIC")
    if rc < 0 or rc in (134, 139) or "memory allocation of" in err:
        kinds.append("ABORT")
    if kinds:
        return kinds[0].lower(), kinds
    if rc == 0:
        return "ok", []
    if rc == 2:
        lines = stderr_lines(err)
        if len(lines) == 1 or is_clap_form(lines) or is_import_report(lines):
            return "user-error", []
        return "multiline", ["MULTILINE"]
    return "other-exit", ["EXIT%d" % rc]


def no_markup(*names):
    """Output files (or stdout, '-') must not carry MARKUP unescaped."""
    def check(d, rc, out, err):
        bad = []
        for n in names:
            text = out if n == "-" else (open(os.path.join(d, n), encoding="utf-8",
                                              errors="replace").read()
                                         if os.path.isfile(os.path.join(d, n)) else "")
            if MARKUP in text:
                bad.append(f"unescaped {MARKUP} in {'stdout' if n == '-' else n}")
        return bad
    return check


def strict_imported_nothing(db, before):
    def check(d, rc, out, err):
        after = db_state(os.path.join(d, db))
        if rc != 0 and after and before is not None and after[1] != before:
            return [f"--strict failed (exit {rc}) but the record count went {before} -> {after[1]}"]
        return []
    return check


# --------------------------------------------------------------------------- cases

def build_cases(host, good_count):
    cases = []
    add = cases.append

    # 1. workload specs -----------------------------------------------------------------
    valid = [
        "matmul:M=2,N=3,K=4", "matmul:K=4,N=3,M=2,dtype=f64", "matmul:M=2,N=2,K=2,dtype=i32",
        "batch_matmul:B=2,M=2,N=3,K=4", "dense_bias_relu:M=2,N=3,K=4",
        "conv2d:N=1,C=2,H=5,W=5,K=2,R=3,S=3", "conv2d:N=1,C=2,H=5,W=5,K=2,R=3,S=3,stride=2,pad=1",
        "depthwise_conv2d:N=1,C=2,H=5,W=5,R=3,S=3", "depthwise_conv2d:N=1,C=2,H=6,W=6,R=3,S=3,stride=2,pad=0",
        "softmax:M=2,N=5", "softmax:M=2,N=5,dtype=f64", "reduce_sum:M=3,N=4",
        "reduce_sum:M=3,N=4,dtype=i32", W,
    ]
    big = "1" * 30
    hostile = [
        ("", "err"), (":", "err"), ("matmul", "err"), ("matmul:", "err"),
        ("matmul:M=2,N=2", "err"), ("matmul:M=2,N=2,K=2,Z=9", "err"),
        ("matmul:M=2,N=2,K=2,M=3", None), ("matmul:M=2,,N=2,K=2", None),
        ("matmul:M=2,N=2,K=2,", None), ("matmul:M=0,N=2,K=2", "err"),
        ("matmul:M=-1,N=2,K=2", "err"), ("matmul:M=2,N=2,K=18446744073709551616", "err"),
        ("matmul:M=4294967296,N=4294967296,K=4294967296", "err"),
        ("matmul:M=9223372036854775807,N=2,K=2", "err"),
        (f"matmul:M={big},N=2,K=2", "err"), ("matmul:M=1e3,N=2,K=2", "err"),
        ("matmul:M=abc,N=2,K=2", "err"), ("matmul:M=2.5,N=2,K=2", "err"),
        ("matmul:M=0x10,N=2,K=2", "err"), ("matmul:M= 2,N=2,K=2", None),
        ("matmul:M=+2,N=2,K=2", None), ("matmul:M=٣,N=2,K=2", "err"),
        ("matmul:M=2,N=2,K=2,dtype=f16", "err"), ("matmul:M=2,N=2,K=2,dtype=", "err"),
        ("MATMUL:M=2,N=2,K=2", "err"), ("matmul:m=2,n=2,k=2", "err"),
        ("mätmul:M=2,N=2,K=2", "err"), ("matmul:M=2\n,N=2,K=2", "err"),
        ("matmul:M=2,N=2,K=2\x1b[31m", "err"), ("matmul:M=2,N=2,K=2\t", None),
        ("matmul:M=2;rm -rf /", "err"), ("matmul:M==2,N=2,K=2", "err"),
        ("matmul:=2,N=2,K=2", "err"), ("matmul:M=2:N=2:K=2", "err"),
        ("matmul:M=2,N=2,K=2@2", None), ("matmul:" + "M=2," * 2500 + "N=2,K=2", None),
        ("x" * 10000, "err"), ("matmul:M=" + "9" * 10000 + ",N=2,K=2", "err"),
        ("conv2d:N=1,C=1,H=2,W=2,K=1,R=3,S=3", "err"),
        ("conv2d:N=1,C=1,H=5,W=5,K=1,R=3,S=3,stride=0", "err"),
        ("conv2d:N=1,C=1,H=5,W=5,K=1,R=3,S=3,pad=-1", "err"),
        ("conv2d:N=1,C=1,H=5,W=5,K=1,R=3,S=3,pad=100000", "err"),
        ("depthwise_conv2d:N=1,C=1,H=5,W=5,R=9,S=9", "err"),
        ("batch_matmul:B=0,M=2,N=2,K=2", "err"), ("reduce_sum:M=2", "err"),
        ("softmax:M=2,N=2,K=2", "err"), ("dense_bias_relu:M=2,N=2", "err"),
        ("\u202ematmul:M=2,N=2,K=2", "err"), ("matmul:M=2,N=2,K=2\x00", "err"),
    ]
    for spec in valid:
        add(Case("specs", ["run", "--workload", spec] + RUN_FAST, expect="ok"))
        add(Case("specs", ["codegen", "--workload", spec, "--emit", "loop"], expect="ok"))
        add(Case("specs", ["tune", "--workload", spec, "--db", "s.db", "-q"] + TUNE_FAST,
                 expect="ok"))
        add(Case("specs", ["show", "--db", "good.db", "--workload", spec], ro=["good.db"]))
    for spec, exp in hostile:
        if "\x00" in spec:
            continue    # argv cannot carry NUL; checked via import files instead
        add(Case("specs", ["run", "--workload", spec] + RUN_FAST, expect=exp))
        add(Case("specs", ["codegen", "--workload", spec, "--emit", "loop"], expect=exp))
        add(Case("specs", ["tune", "--workload", spec, "--db", "s.db", "-q"] + TUNE_FAST,
                 expect=exp))
        add(Case("specs", ["show", "--db", "good.db", "--workload", spec], ro=["good.db"]))
    # weights
    for wt in ["0", "-1", "nan", "inf", "1e400", "abc", "", "2@3", "1e-300"]:
        add(Case("specs", ["tune", "--workload", f"{W}@{wt}", "--db", "s.db", "-q"] + TUNE_FAST))
    # large but valid extents: only codegen (no buffers are allocated)
    for spec in ["matmul:M=100000,N=100000,K=100000", "conv2d:N=64,C=512,H=512,W=512,K=512,R=7,S=7"]:
        add(Case("specs", ["codegen", "--workload", spec, "--emit", "loop"]))
    # run of a workload too large for memory: must refuse, not abort
    add(Case("specs", ["run", "--workload", "matmul:M=1000000,N=1000000,K=1000000"] + RUN_FAST,
             expect="err"))
    add(Case("specs", ["run", "--workload", "batch_matmul:B=100000,M=1000,N=1000,K=1000"]
             + RUN_FAST, expect="err"))
    add(Case("specs", ["tune", "--workload", W, "--workload", W, "--db", "s.db", "-q"] + TUNE_FAST))
    add(Case("specs", ["best", "--db", "good.db", "--workload", "bogus"], ro=["good.db"],
             expect="err"))
    add(Case("specs", ["plot", "--db", "good.db", "--workload", "matmul:M=0,N=1,K=1"],
             ro=["good.db"], expect="err"))

    # 2. numeric flags ------------------------------------------------------------------
    bad_nums = ["0", "-1", "1e400", "inf", "nan", "100000", "18446744073709551616", "",
                "abc", "1.5", "0x10", " 1"]
    tune_base = ["tune", "--workload", W, "--db", "n.db", "-q"]
    tune_flags = {"--trials": ["2", "--batch-size", "2", "--population", "16"],
                  "--seed": TUNE_FAST, "--threads": TUNE_FAST, "--time-budget": TUNE_FAST,
                  "--early-stop": TUNE_FAST, "--batch-size": ["--trials", "2", "--population", "16"],
                  "--population": ["--trials", "2", "--batch-size", "2"],
                  "--max-unrolled-statements": TUNE_FAST}
    for flag, rest in tune_flags.items():
        for v in bad_nums:
            if flag == "--trials":
                args = tune_base + ["--trials", v, "--batch-size", "2", "--population", "16"]
            else:
                args = tune_base + rest + [flag, v]
            add(Case("numeric", args))
    run_base = ["run", "--workload", "matmul:M=2,N=2,K=2"]
    for flag in ["--threads", "--repeat", "--min-repeat-ms", "--timeout"]:
        for v in bad_nums:
            rest = {"--repeat": ["--min-repeat-ms", "1", "--timeout", "20"],
                    "--min-repeat-ms": ["--repeat", "1", "--timeout", "20"]}.get(flag, RUN_FAST)
            add(Case("numeric", run_base + rest + [flag, v]))
    # a long but valid request must end at --timeout with exit 2, not block
    add(Case("numeric", run_base + ["--repeat", "100000", "--timeout", "3"], expect="err"))
    add(Case("numeric", run_base + ["--min-repeat-ms", "60000", "--timeout", "3"], expect="err"))
    add(Case("numeric", run_base + ["--timeout", "0.001"]))
    for v in bad_nums:
        add(Case("numeric", ["codegen", "--workload", "matmul:M=2,N=2,K=2", "--threads", v]))
    ev = ["model", "eval", "--db", "good.db"]
    for flag in ["--min-records", "--seed", "--rounds", "--max-bin", "--max-depth",
                 "--min-child-weight"]:
        for v in ["0", "-1", "nan", "inf", "1e400", "100000", "abc", "18446744073709551616"]:
            extra = [] if flag == "--min-records" else ["--min-records", "1"]
            add(Case("numeric", ev + extra + [flag, v], ro=["good.db"]))
    add(Case("numeric", ["-vvvvvvvvvv", "records", "--db", "good.db"], ro=["good.db"]))
    add(Case("numeric", ["-q", "-v", "records", "--db", "good.db"], ro=["good.db"]))
    add(Case("numeric", ["tune", "--task-scheduler", "fastest", "--workload", W, "--db", "n.db"]
             + TUNE_FAST, expect="err"))
    add(Case("numeric", ["model", "eval", "--db", "good.db", "--objective", "lol"], expect="err"))
    add(Case("numeric", ["model", "train", "--db", "good.db", "--out", "m.json",
                         "--objective", "both"], ro=["good.db"]))
    add(Case("numeric", ["codegen", "--workload", W, "--emit", "exe"], expect="err"))
    add(Case("numeric", ["completions", "tcsh"], expect="err"))
    for sh_ in ["bash", "zsh", "fish", "elvish", "powershell"]:
        add(Case("numeric", ["completions", sh_], expect="ok"))

    # 3. targets ------------------------------------------------------------------------
    targets = ["llvm -mcpu=skylake", "cuda", "cuda -arch=sm_90", "garbage", "", "llvm\n-mcpu=x",
               host, host.replace("-threads=1", "-threads=2"), "llvm -threads=-1",
               "llvm -mattr=+avx512f", "llvm -mcpu=\u00e9\u4e2d", "llvm " + "x" * 10000, MARKUP,
               "llvm", "LLVM"]
    for t in targets:
        add(Case("targets", ["best", "--db", "good.db", "--workload", W, "--target", t],
                 ro=["good.db"]))
        add(Case("targets", ["show", "--db", "good.db", "--workload", W, "--target", t],
                 ro=["good.db"]))
        add(Case("targets", ["plot", "--db", "good.db", "--workload", W, "--target", t,
                             "--out", "c.svg"], ro=["good.db"], check=no_markup("c.svg")))
        add(Case("targets", ["codegen", "--db", "good.db", "--workload", W, "--target", t,
                             "--emit", "loop"], ro=["good.db"]))
        add(Case("targets", ["tune", "--workload", W, "--db", "t.db", "--target", t, "-q"]
                 + TUNE_FAST))
        add(Case("targets", ["model", "train", "--db", "good.db", "--target", t, "--out",
                             "m.json"], ro=["good.db"]))
        add(Case("targets", ["model", "eval", "--db", "good.db", "--target", t,
                             "--min-records", "1"], ro=["good.db"]))
    add(Case("targets", ["codegen", "--db", "good.db", "--workload", W, "--target", "cuda",
                         "--emit", "loop", "--fallback"], ro=["good.db"]))

    # 4. databases ----------------------------------------------------------------------
    dbs = ["good.db", "missing.db", "empty.db", "random.db", "text.db", "trunc.db",
           "trunc100.db", "header.db", "newer.db", "older.db", "v0.db", "negver.db", "other.db",
           "blank.db", "norecords.db", "hostile_lat.db", "hostile_trace.db", "hostile_keys.db",
           "hostile_huge.db", "hostile_ref.db", "hostile_all.db", "/dev/null", "adir.db",
           "dangling.db"]
    for db in dbs:
        ro = [db]
        readers = [
            ["records", "--db", db],
            ["best", "--db", db, "--workload", W],
            ["best", "--db", db, "--workload", W, "--json"],
            ["export", "--db", db],
            ["show", "--db", db, "--workload", W],
            ["report", "--db", db, "--out", "r.html"],
            ["plot", "--db", db, "--workload", W, "--out", "c.svg"],
            ["run", "--db", db, "--workload", W] + RUN_FAST,
            ["codegen", "--db", db, "--workload", W, "--emit", "loop"],
            ["codegen", "--db", db, "--workload", W, "--emit", "asm"],
            ["model", "train", "--db", db, "--out", "m.json"],
            ["model", "eval", "--db", db, "--min-records", "1"],
        ]
        for args in readers:
            chk = no_markup("r.html") if args[0] == "report" else (
                no_markup("c.svg") if args[0] == "plot" else None)
            add(Case("databases", args, ro=ro, check=chk,
                     expect="ok" if db == "good.db" else None))
        add(Case("databases", ["tune", "--workload", W, "--db", db, "-q"] + TUNE_FAST, rw=[db]))
        add(Case("databases", ["import", "--db", db, "good.jsonl"], rw=[db]))
        add(Case("databases", ["merge", "--into", db, "good.db"], rw=[db], ro=["good.db"]
                 if db != "good.db" else []))
        add(Case("databases", ["merge", "--into", "new.db", db], ro=[db]))

    # 5. import files and merges --------------------------------------------------------
    names = sorted(n[4:-6] for n in os.listdir(FX) if n.startswith("imp_"))
    for n in names:
        f = f"imp_{n}.jsonl"
        add(Case("imports", ["import", "--db", "good.db", f], rw=["good.db"],
                 expect="ok" if n in ("good", "crlf", "extra", "dup") else None))
        add(Case("imports", ["import", "--db", "good.db", "--strict", f], rw=["good.db"],
                 check=strict_imported_nothing("good.db", good_count)))
        if n in ("good", "mixed", "binary", "deep", "neg"):
            add(Case("imports", ["import", "--db", "fresh.db", f]))
    add(Case("imports", ["import", "--db", "good.db", "-"],
             stdin=open(os.path.join(FX, "imp_good.jsonl"), "rb").read(), rw=["good.db"],
             expect="ok"))
    add(Case("imports", ["import", "--db", "good.db", "-"],
             stdin=open(os.path.join(FX, "imp_binary.jsonl"), "rb").read(), rw=["good.db"]))
    add(Case("imports", ["import", "--db", "good.db", "-"], stdin=b"", rw=["good.db"]))
    for f in ["missing.jsonl", "adir", "/dev/null", "good.db", "random.db", "link.db"]:
        add(Case("imports", ["import", "--db", "good.db", f], rw=["good.db"],
                 ro=["good.db"] if f in ("good.db", "link.db") else []))
    for src in ["hostile_lat.db", "hostile_trace.db", "hostile_keys.db", "hostile_huge.db",
                "hostile_ref.db", "hostile_all.db", "newer.db", "older.db", "random.db",
                "trunc.db", "other.db"]:
        add(Case("imports", ["merge", "--into", "good.db", src], rw=["good.db"], ro=[src]))
        add(Case("imports", ["merge", "--into", "new.db", "good.db", src], ro=["good.db", src]))
    add(Case("imports", ["merge", "--into", "new.db", "good.db", "good.db", "good.db"],
             ro=["good.db"], expect="ok"))
    add(Case("imports", ["merge", "--into", "new.db", "hostile_lat.db", "hostile_trace.db",
                         "hostile_keys.db", "hostile_ref.db"],
             ro=["hostile_lat.db", "hostile_trace.db", "hostile_keys.db", "hostile_ref.db"]))
    add(Case("imports", ["merge", "--into", "new.db"], expect="err"))
    add(Case("imports", ["merge", "--into", "new.db", "missing.db"]))

    # 6. output paths -------------------------------------------------------------------
    same = ["good.db", "./good.db", "link.db", "adir/../good.db"]
    for o in same:
        add(Case("outputs", ["export", "--db", "good.db", "--out", o], ro=["good.db"]))
        add(Case("outputs", ["report", "--db", "good.db", "--out", o], ro=["good.db"]))
        add(Case("outputs", ["plot", "--db", "good.db", "--workload", W, "--out", o],
                 ro=["good.db"]))
        add(Case("outputs", ["model", "train", "--db", "good.db", "--out", o], ro=["good.db"]))
        add(Case("outputs", ["codegen", "--db", "good.db", "--workload", W, "--emit", "obj",
                             "--out", o], ro=["good.db"]))
        add(Case("outputs", ["codegen", "--db", "good.db", "--workload", W, "--emit", "llvm",
                             "--out", o], ro=["good.db"]))
        add(Case("outputs", ["codegen", "--db", "good.db", "--workload", W, "--emit", "obj",
                             "--out", "k.o", "--header", o], ro=["good.db"]))
        add(Case("outputs", ["run", "--db", "good.db", "--workload", W, "--output", o]
                 + RUN_FAST, ro=["good.db"]))
        add(Case("outputs", ["merge", "--into", o, "good.db"], rw=["good.db"]))
        add(Case("outputs", ["import", "--db", "good.db", o], rw=["good.db"]))
    add(Case("outputs", ["merge", "--into", "good.db", "good.db", "hostile_lat.db"],
             rw=["good.db"], ro=["hostile_lat.db"]))
    # a codegen object named like its own header
    add(Case("outputs", ["codegen", "--workload", W, "--emit", "obj", "--out", "k.o",
                         "--header", "k.o"]))
    add(Case("outputs", ["codegen", "--workload", W, "--emit", "obj", "--out", "k.h"]))
    add(Case("outputs", ["codegen", "--workload", W, "--emit", "obj", "--out", "./k.o",
                         "--header", "k.o"]))
    add(Case("outputs", ["codegen", "--workload", W, "--emit", "obj"], expect="err"))
    # an input named as an output
    add(Case("outputs", ["run", "--workload", "matmul:M=2,N=2,K=2", "--inputs", "a.npy,b.npy",
                         "--output", "a.npy"] + RUN_FAST))
    add(Case("outputs", ["export", "--db", "good.db", "--out", "good.jsonl"], ro=["good.db"]))
    add(Case("outputs", ["report", "--db", "hostile_keys.db", "--out", "-"],
             ro=["hostile_keys.db"], check=no_markup("-")))
    add(Case("outputs", ["plot", "--db", "hostile_keys.db", "--workload", W, "--out", "-"],
             ro=["hostile_keys.db"], check=no_markup("-")))
    for o in ["missing/dir/out.x", "adir", "/dev/null", "/proc/version", "", "-"]:
        add(Case("outputs", ["export", "--db", "good.db", "--out", o], ro=["good.db"]))
        add(Case("outputs", ["report", "--db", "good.db", "--out", o], ro=["good.db"]))
        add(Case("outputs", ["plot", "--db", "good.db", "--workload", W, "--out", o],
                 ro=["good.db"]))
        add(Case("outputs", ["model", "train", "--db", "good.db", "--out", o], ro=["good.db"]))
        add(Case("outputs", ["codegen", "--workload", W, "--emit", "obj", "--out", o]))
        add(Case("outputs", ["run", "--workload", "matmul:M=2,N=2,K=2", "--output", o]
                 + RUN_FAST))
        add(Case("outputs", ["tune", "--workload", W, "--db", o, "-q"] + TUNE_FAST))
        add(Case("outputs", ["merge", "--into", o, "good.db"], ro=["good.db"]))

    # 7. environment --------------------------------------------------------------------
    llvm_args = ["-bogus", "-help", "--version", "", " ", "-unroll-threshold=300",
                 "-unroll-threshold=abc", "-unroll-threshold=-1", "-x" * 5000, "-a\n-b",
                 "-\u00e9", "-print-after-all", "-O0", "--", "-stats"]
    for v in llvm_args:
        e = {"TENSORTUNE_LLVM_ARGS": v}
        add(Case("env", ["run", "--workload", "matmul:M=2,N=2,K=2"] + RUN_FAST, env=e))
        add(Case("env", ["codegen", "--workload", "matmul:M=2,N=2,K=2", "--emit", "asm"], env=e))
        add(Case("env", ["tune", "--workload", W, "--db", "e.db", "-q"] + TUNE_FAST, env=e))
    busy = ["forever", "-1", "86401", "nan", "", "1e400", " 5", "5s", "0", "86400", "1.5"]
    for v in busy:
        e = {"TENSORTUNE_BUSY_TIMEOUT": v}
        add(Case("env", ["tune", "--workload", W, "--db", "good.db", "-q"] + TUNE_FAST, env=e,
                 rw=["good.db"]))
        add(Case("env", ["import", "--db", "good.db", "good.jsonl"], env=e, rw=["good.db"]))
        add(Case("env", ["merge", "--into", "good.db", "hostile_lat.db"], env=e, rw=["good.db"]))
        add(Case("env", ["records", "--db", "good.db"], env=e, ro=["good.db"]))
    # a database locked by another process
    for args in (["tune", "--workload", W, "--db", "good.db", "-q"] + TUNE_FAST,
                 ["import", "--db", "good.db", "good.jsonl"],
                 ["merge", "--into", "good.db", "hostile_lat.db"]):
        add(Case("env", args, env={"TENSORTUNE_BUSY_TIMEOUT": "1"}, lock="good.db",
                 rw=["good.db"], expect="err"))
    for args in (["records", "--db", "good.db"], ["export", "--db", "good.db"],
                 ["best", "--db", "good.db", "--workload", W]):
        add(Case("env", args, env={"TENSORTUNE_BUSY_TIMEOUT": "1"}, lock="good.db",
                 ro=["good.db"]))
    faults = ["boom@1", "segv", "segv@", "@1", "segv@-1", "segv@x", ",", "segv@1,,oob@2",
              "segv@99999999999999999999", "SEGV@0", "segv@0;hang@1", "segv@0 ", "\u00e9@0",
              "hang@0,hang@0"]
    for v in faults:
        add(Case("env", ["tune", "--workload", W, "--db", "f.db", "-q"] + TUNE_FAST,
                 env={"TENSORTUNE_INJECT_FAULTS": v}))

    def four_errors(d, rc, out, err):
        n, t = error_records(os.path.join(d, "fault.db"))
        if rc != 0 or n != 4:
            return [f"valid fault plan: exit {rc}, {n} error records of {t} (want exit 0, 4)"]
        return []
    add(Case("env", ["tune", "--trials", "8", "--batch-size", "4", "--population", "16",
                     "--workload", "matmul:M=3,N=5,K=7", "--db", "fault.db"],
             env={"TENSORTUNE_INJECT_FAULTS": "segv@0,oob@1,hang@2,alloc@3"},
             check=four_errors, expect="ok", timeout=120, note="fault plan"))
    for e in [{"RUST_LOG": "trace"}, {"RUST_LOG": "=garbage=,,::"}, {"RUST_LOG": "x" * 10000},
              {"TMPDIR": "/nonexistent"}, {"HOME": ""}, {"LANG": "xx_XX.bogus"},
              {"RUST_MIN_STACK": "1"}]:
        add(Case("env", ["run", "--workload", "matmul:M=2,N=2,K=2"] + RUN_FAST, env=e))
        add(Case("env", ["codegen", "--workload", W, "--emit", "obj", "--out", "k.o"], env=e))

    # 8. .npy inputs ---------------------------------------------------------------------
    npy_names = sorted(n[:-4] for n in os.listdir(FX) if n.endswith(".npy") and n != "dir.npy")
    mm = ["run", "--workload", "matmul:M=2,N=2,K=2"] + RUN_FAST
    for n in npy_names:
        add(Case("npy", mm + ["--inputs", f"{n}.npy,b.npy", "--output", "c.npy"],
                 expect="ok" if n in ("a", "b", "be", "nan", "v2") else None))
        add(Case("npy", mm + ["--inputs", f"a.npy,{n}.npy"]))
    for inputs in ["a.npy", "a.npy,b.npy,b.npy", ",", "", "a.npy,", ",b.npy", "dir.npy,b.npy",
                   "/dev/null,b.npy", "missing.npy,b.npy", "a.npy,a.npy", "good.db,b.npy",
                   "/dev/zero,b.npy"]:
        add(Case("npy", mm + ["--inputs", inputs]))
    add(Case("npy", ["run", "--workload", "softmax:M=2,N=2"] + RUN_FAST + ["--inputs", "a.npy"],
             expect="ok"))
    add(Case("npy", ["run", "--workload", "softmax:M=2,N=2,dtype=f64"] + RUN_FAST
             + ["--inputs", "f8.npy"], expect="ok"))
    add(Case("npy", ["run", "--workload", "reduce_sum:M=2,N=2,dtype=i32"] + RUN_FAST
             + ["--inputs", "i4.npy", "--output", "o.npy"], expect="ok"))
    add(Case("npy", ["run", "--workload", "matmul:M=2,N=2,K=2,dtype=f64"] + RUN_FAST
             + ["--inputs", "a.npy,b.npy"], expect="err"))
    add(Case("npy", ["run", "--db", "good.db", "--workload", W] + RUN_FAST
             + ["--inputs", "a.npy,b.npy"], ro=["good.db"], expect="err"))
    return cases


# --------------------------------------------------------------------------- running

def clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TENSORTUNE_") and k not in ("RUST_LOG",)}
    env.pop("RUST_BACKTRACE", None)
    return env


def hold_lock(path):
    code = ("import sqlite3,sys,time\n"
            "c=sqlite3.connect(sys.argv[1],isolation_level=None,timeout=0)\n"
            "c.execute('BEGIN EXCLUSIVE')\n"
            "print('locked',flush=True)\n"
            "time.sleep(300)\n")
    p = subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    line = p.stdout.readline()
    if b"locked" not in line:
        p.kill()
        p.wait()
        return None
    return p


def run_case(case, bin_path, pin, root, timeout):
    d = tempfile.mkdtemp(prefix="case-", dir=root)
    text = " ".join(case.args) + " " + (case.lock or "")
    for name in os.listdir(FX):
        src = os.path.join(FX, name)
        dst = os.path.join(d, name)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif os.path.isdir(src):
            os.mkdir(dst)
        elif name == "good.db" or name in text:   # copy only what the command names
            shutil.copyfile(src, dst)
    paths = lambda ps: [p if os.path.isabs(p) else os.path.join(d, p) for p in ps]
    before = {p: db_state(p) for p in paths(case.ro + case.rw)}
    env = clean_env()
    env.update(case.env)
    locker = hold_lock(os.path.join(d, case.lock)) if case.lock else None
    t0 = time.time()
    timed_out = False
    p = subprocess.Popen(pin + [bin_path] + case.args, cwd=d, env=env,
                         stdin=subprocess.PIPE if case.stdin is not None else subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = p.communicate(case.stdin, timeout=case.timeout or timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
    secs = time.time() - t0
    if locker:
        locker.kill()
        locker.wait()
    rc = p.returncode
    out = out.decode("utf-8", errors="replace")
    err = err.decode("utf-8", errors="replace")
    base, kinds = classify(rc, timed_out, out, err)
    problems = []
    lost = []
    for p_ in paths(case.ro):
        b, a = before[p_], db_state(p_)
        if b is not None and (a is None or a[0] != b[0]):
            lost.append(f"{os.path.relpath(p_, d)} must only be read but changed "
                        f"(records {b[1]} -> {a[1] if a else 'file gone'})")
    for p_ in paths(case.rw):
        b, a = before[p_], db_state(p_)
        if b is not None and b[1] is not None and (a is None or a[1] is None or a[1] < b[1]):
            lost.append(f"{os.path.relpath(p_, d)} lost records: {b[1]} -> "
                        f"{a[1] if a else 'file gone'}")
    # A device named as an output must stay a device: an output written by rename would put
    # a regular file in its place (as root, /dev/null for the whole machine).
    for dev in ("/dev/null",):
        if os.path.exists(dev) and not stat.S_ISCHR(os.stat(dev).st_mode):
            lost.append(f"{dev} is no longer a device")
    if lost:
        kinds.append("DATA-LOSS")
    if not timed_out:
        if case.expect == "ok" and rc != 0:
            problems.append(f"valid input refused (exit {rc})")
        elif case.expect == "err" and rc == 0:
            problems.append("invalid input accepted (exit 0)")
        if case.check:
            problems += case.check(d, rc, out, err)
    if problems:
        kinds.append("OTHER")
    problems = lost + problems
    shutil.rmtree(d, ignore_errors=True)
    return dict(case=case, rc=rc, timed_out=timed_out, secs=secs, base=base, kinds=kinds,
                problems=problems, err=err, out=out)


def pin_prefix():
    ts = shutil.which("taskset")
    if ts and subprocess.run([ts, "-c", "1", "true"], capture_output=True).returncode == 0:
        return [ts, "-c", "1"]
    return []


def table(results):
    cols = ["commands", "ok", "user errors (exit 2, one line)", "other exit codes", "panics",
            "aborts", "hangs", "multi-line errors", "data loss", "other defects"]
    rows = []
    total = [0] * len(cols)
    for key, title in CATEGORIES:
        rs = [r for r in results if r["case"].cat == key]
        if not rs:
            continue
        v = [len(rs),
             sum(r["base"] == "ok" for r in rs),
             sum(r["base"] == "user-error" for r in rs),
             sum(r["base"] == "other-exit" for r in rs),
             sum("PANIC" in r["kinds"] for r in rs),
             sum("ABORT" in r["kinds"] for r in rs),
             sum("HANG" in r["kinds"] for r in rs),
             sum("MULTILINE" in r["kinds"] for r in rs),
             sum("DATA-LOSS" in r["kinds"] for r in rs),
             sum("OTHER" in r["kinds"] for r in rs)]
        total = [a + b for a, b in zip(total, v)]
        rows.append([title] + v)
    rows.append(["**total**"] + total)
    lines = ["| category | " + " | ".join(cols) + " |",
             "| --- | " + " | ".join("---:" for _ in cols) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(str(x) for x in r) + " |")
    return "\n".join(lines)


def short(s, n=200):
    s = s.strip().replace("\n", "\\n")
    return s[:n] + ("…" if len(s) > n else "")


def main():
    global FX
    ap = argparse.ArgumentParser(description="Hostile-user probe of the tensortune CLI")
    ap.add_argument("--bin", default=DEFAULT_BIN, help="the tensortune binary")
    ap.add_argument("--quick", action="store_true", help="about 100 commands")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per command (60)")
    ap.add_argument("--only", choices=[k for k, _ in CATEGORIES], help="one category")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    a = ap.parse_args()
    bin_path = os.path.abspath(a.bin)
    if not os.access(bin_path, os.X_OK):
        print(f"probe: no executable at {bin_path}", file=sys.stderr)
        return 2
    pin = pin_prefix()
    root = tempfile.mkdtemp(prefix="tensortune-probe-")
    FX = os.path.join(root, "fixtures")
    os.mkdir(FX)
    t0 = time.time()
    print(f"probe: binary {bin_path}; pinned: {' '.join(pin) or 'no'}; folder {root}",
          file=sys.stderr)
    host = build_fixtures(bin_path, FX, pin)
    good_count = record_count(os.path.join(FX, "good.db"))
    cases = build_cases(host, good_count)
    if a.only:
        cases = [c for c in cases if c.cat == a.only]
    if a.quick:
        picked = []
        for key, _ in CATEGORIES:
            cs = [c for c in cases if c.cat == key]
            step = max(1, len(cs) // 12)
            picked += [c for i, c in enumerate(cs) if i % step == 0 or c.note == "fault plan"]
        cases = picked
    results = []
    for i, c in enumerate(cases):
        r = run_case(c, bin_path, pin, root, a.timeout)
        results.append(r)
        flag = ",".join(r["kinds"]) or r["base"]
        print(f"[{i + 1}/{len(cases)}] {r['secs']:6.2f}s rc={r['rc']} {flag:12} "
              f"{short(c.cmdline(), 150)}", file=sys.stderr)
    elapsed = time.time() - t0
    print(f"## tensortune probe: {len(results)} commands in {elapsed:.0f} s\n")
    print(table(results))
    defects = [r for r in results if r["kinds"]]
    print(f"\n### Defects ({len(defects)})\n")
    for r in defects:
        print(f"- **{','.join(r['kinds'])}** (exit {'timeout' if r['timed_out'] else r['rc']}, "
              f"{r['secs']:.1f} s): `{short(r['case'].cmdline(), 300)}`")
        for pr in r["problems"]:
            print(f"  - {pr}")
        print(f"  - stderr: `{short(r['err'])}`")
    if not defects:
        print("none")
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if defects else 0


FX = None

if __name__ == "__main__":
    sys.exit(main())
