"""Checkpoint readiness (builder/serving/checkpoint.py, `build-image checkpoint verify`).

Good shards are written by the safetensors library (tests/fx_checkpoint.py);
bad ones are those files damaged the way real downloads and hand edits damage
them.  Where the safetensors library can judge a file, the test also asserts
that it judges it the same way as build-image's header parser.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import safetensors
from click.testing import CliRunner

from builder import events
from builder.cli import main
from builder.serving import checkpoint as ck
from builder.serving import checkpoint_content as cc
from tests.fx_checkpoint import (
    CONFIG,
    HIDDEN,
    LAYERS,
    PLE_DIM,
    VOCAB,
    sha256sum_file,
    shard_bytes,
    sharded,
    write_checkpoint,
)

S1, S2, S3 = (f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3))


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path / "user-cache"))


def verify(*args: str) -> tuple[int, dict | None, str]:
    r = CliRunner().invoke(main, ["checkpoint", "verify", *args, "--json"])
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        doc = None
    return r.exit_code, doc, r.stderr


def errors_for(doc: dict, name: str) -> list[str]:
    return [e["message"] for e in doc["errors"] if e["file"] == name]


def library_accepts(path: Path) -> bool:
    try:
        safetensors.deserialize(path.read_bytes())
        return True
    except Exception:  # noqa: BLE001 - SafetensorError and friends
        return False


def snapshot(d: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(d)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(d.rglob("*"))}


def expected_bytes() -> dict[str, int]:
    return {
        "BF16": 2 * (VOCAB * HIDDEN + 64 * HIDDEN + VOCAB * HIDDEN + VOCAB * LAYERS * PLE_DIM),
        "F32": 4 * (HIDDEN + 1),
        "F8_E4M3": 64 * HIDDEN,
    }


# --------------------------------------------------------------------------- ready


def test_complete_sharded_checkpoint_is_ready_with_exact_totals(tmp_path):
    d = sharded(tmp_path / "ck")
    assert all(library_accepts(p) for p in d.glob("*.safetensors"))
    before = snapshot(d)
    code, doc, _ = verify(str(d))
    assert code == 0, doc
    assert doc["verdict"] == "READY" and doc["errors"] == [] and doc["warnings"] == []
    want = expected_bytes()
    assert doc["bytes_by_dtype"] == want
    assert doc["weight_bytes"] == sum(want.values()) == doc["index_total_size"]
    assert doc["ple_bytes"] == 2 * VOCAB * LAYERS * PLE_DIM
    assert doc["ple_tensors"] == ["model.language_model.embed_tokens_per_layer.shard_.weight"]
    assert doc["tensors"] == 7 and doc["headers_complete"]
    assert doc["content"] == {"checked": False}
    assert snapshot(d) == before  # nothing written into the checkpoint


def test_text_report_names_verdict_and_totals(tmp_path):
    d = sharded(tmp_path / "ck")
    r = CliRunner().invoke(main, ["checkpoint", "verify", str(d)])
    assert r.exit_code == 0
    assert r.stdout.startswith(f"READY: {d}")
    assert f"weight bytes (exact, from the headers): {sum(expected_bytes().values())}" in r.stdout
    assert f"per-layer-embedding table: {2 * VOCAB * LAYERS * PLE_DIM} bytes" in r.stdout
    assert "content: not hashed" in r.stdout


def test_structural_pass_reads_no_tensor_data(tmp_path):
    """A 40 GB shard (sparse: no disk used) is judged from its header, in well under a second."""
    d = tmp_path / "big"
    d.mkdir()
    rows = 40 * 10**9 // (2 * 4096)
    header = json.dumps(
        {"w.weight": {"dtype": "BF16", "shape": [rows, 4096], "data_offsets": [0, rows * 4096 * 2]}}
    ).encode()
    p = d / "model.safetensors"
    with open(p, "wb") as fh:
        fh.write(len(header).to_bytes(8, "little") + header)
        fh.truncate(8 + len(header) + rows * 4096 * 2)
    (d / "config.json").write_text("{}")
    rep = ck.inspect_checkpoint(d)
    assert rep.ready() and rep.weight_bytes == rows * 4096 * 2
    assert rep.structural_seconds < 1.0
    assert os.stat(p).st_blocks * 512 < 1 << 20  # nothing was materialised


# --------------------------------------------------------------------------- not ready: files


def test_truncated_shard_is_caught_without_hashing(tmp_path):
    d = sharded(tmp_path / "ck")
    sums = sha256sum_file(d)
    p = d / S2
    p.write_bytes(p.read_bytes()[:-100])
    assert not library_accepts(p)
    code, doc, err = verify(str(d), "--sha256", str(sums))
    assert code == 1 and doc["verdict"] == "NOT READY"
    [msg] = errors_for(doc, S2)
    assert "truncated" in msg and "100 bytes" in msg
    assert doc["content"]["checked"] is False and "structural" in doc["content"]["skipped"]
    assert S2 in err and "NOT READY" in err
    # the header is whole: the tensors are still counted, the other shards still checked
    assert doc["weight_bytes"] == sum(expected_bytes().values())


def test_missing_shard_named_by_index(tmp_path):
    d = sharded(tmp_path / "ck")
    (d / S1).unlink()
    code, doc, _ = verify(str(d))
    assert code == 1
    [msg] = errors_for(doc, S1)
    assert "missing" in msg and "3 tensor(s)" in msg
    assert not doc["headers_complete"]


def test_shard_outside_index_warns_and_strict_refuses(tmp_path):
    d = sharded(tmp_path / "ck")
    (d / "model-00004-of-00003.safetensors").write_bytes(shard_bytes({"extra.weight": ("BF16", [4, 4])}))
    code, doc, _ = verify(str(d))
    assert code == 0 and doc["verdict"] == "READY"
    [w] = [w for w in doc["warnings"] if w["file"] == "model-00004-of-00003.safetensors"]
    assert "not in model.safetensors.index.json" in w["message"]
    assert doc["weight_bytes"] == sum(expected_bytes().values())  # vLLM does not load it
    code, doc, _ = verify(str(d), "--strict")
    assert code == 1 and doc["verdict"] == "NOT READY"


def _rewrite_header(p: Path, edit) -> None:
    data = p.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    edit(header)
    new = json.dumps(header).encode()
    p.write_bytes(len(new).to_bytes(8, "little") + new + data[8 + n :])


BAD_HEADERS = {
    "garbage-length": (lambda b: (2**63 + 12345).to_bytes(8, "little") + b[8:], "not a safetensors length"),
    "length-past-end": (lambda b: (len(b) + 10).to_bytes(8, "little") + b[8:], "only"),
    "invalid-json": (lambda b: b[:8] + b"{\"x\": [" + b[15:], "not valid JSON"),
    "empty-file": (lambda b: b"", "shorter than the 8-byte header length field"),
}


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_broken_header_names_the_file(tmp_path, case):
    d = sharded(tmp_path / "ck")
    p = d / S1
    damage, words = BAD_HEADERS[case]
    p.write_bytes(damage(p.read_bytes()))
    assert not library_accepts(p)
    code, doc, _ = verify(str(d))
    assert code == 1
    msgs = errors_for(doc, S1)
    assert len(msgs) == 1 and words in msgs[0], msgs
    assert errors_for(doc, S2) == [] and errors_for(doc, S3) == []


def test_overlapping_offsets(tmp_path):
    d = sharded(tmp_path / "ck")
    p = d / S1

    def edit(h):
        t = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
        second = h[t[1]]["data_offsets"]
        h[t[1]]["data_offsets"] = [second[0] - 8, second[1] - 8]
        for k in t[2:]:
            o = h[k]["data_offsets"]
            h[k]["data_offsets"] = [o[0] - 8, o[1] - 8]
        p_trailing[0] = 8

    p_trailing = [0]
    _rewrite_header(p, edit)
    p.write_bytes(p.read_bytes()[: -p_trailing[0]])  # the file ends where the shifted header says
    assert not library_accepts(p)
    code, doc, _ = verify(str(d))
    assert code == 1
    [msg] = errors_for(doc, S1)
    assert "overlap" in msg


def test_gap_between_tensors(tmp_path):
    d = sharded(tmp_path / "ck")
    p = d / S1

    def edit(h):
        t = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
        for k in t[1:]:
            o = h[k]["data_offsets"]
            h[k]["data_offsets"] = [o[0] + 4, o[1] + 4]

    _rewrite_header(p, edit)
    p.write_bytes(p.read_bytes() + b"\0" * 4)
    assert not library_accepts(p)
    code, doc, _ = verify(str(d))
    [msg] = errors_for(doc, S1)
    assert code == 1 and "contiguous" in msg


def test_unknown_dtype(tmp_path):
    d = sharded(tmp_path / "ck")
    p = d / S2
    _rewrite_header(p, lambda h: h["lm_head.weight"].update(dtype="Q4_K"))
    assert not library_accepts(p)
    code, doc, _ = verify(str(d))
    [msg] = errors_for(doc, S2)
    assert code == 1 and "unknown dtype 'Q4_K'" in msg and "lm_head.weight" in msg


def test_shape_that_does_not_match_the_span(tmp_path):
    d = sharded(tmp_path / "ck")
    p = d / S2
    _rewrite_header(p, lambda h: h["lm_head.weight"].update(shape=[VOCAB, HIDDEN + 1]))
    assert not library_accepts(p)
    code, doc, _ = verify(str(d))
    [msg] = errors_for(doc, S2)
    assert code == 1 and "needs" in msg and "span" in msg


def test_trailing_bytes_after_the_data(tmp_path):
    d = sharded(tmp_path / "ck")
    p = d / S3
    p.write_bytes(p.read_bytes() + b"junk")
    assert not library_accepts(p)
    code, doc, _ = verify(str(d))
    [msg] = errors_for(doc, S3)
    assert code == 1 and "4 more than its header accounts for" in msg


def test_symlink_loop_and_dangling_link(tmp_path):
    d = sharded(tmp_path / "ck")
    (d / S3).unlink()
    os.symlink("loop-b.safetensors", d / S3)
    os.symlink(S3, d / "loop-b.safetensors")
    os.symlink("nowhere.bin", d / "tokenizer.json")
    code, doc, _ = verify(str(d))
    assert code == 1
    [msg] = errors_for(doc, S3)
    assert "symlink loop" in msg
    assert "dangling symlink" in errors_for(doc, "tokenizer.json")[0]
    # the loop is not also reported as a missing shard
    assert not any("missing" in m for m in errors_for(doc, S3))


def test_unreadable_shard(tmp_path):
    d = sharded(tmp_path / "ck")
    (d / S2).chmod(0)
    if os.geteuid() != 0:
        code, doc, _ = verify(str(d))
    else:  # root reads anything: run the verifier without the capabilities that let it
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root and util-linux's setpriv is not installed")
        drop = "-dac_override,-dac_read_search"
        r = subprocess.run(
            [
                setpriv,
                f"--bounding-set={drop}",
                f"--inh-caps={drop}",
                "--",
                sys.executable,
                "-m",
                "builder.cli",
                "checkpoint",
                "verify",
                str(d),
                "--json",
            ],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent.parent,
        )
        code, doc = r.returncode, json.loads(r.stdout)
    assert code == 1
    [msg] = errors_for(doc, S2)
    assert "cannot be read" in msg and "ermission denied" in msg


def test_index_that_is_not_json(tmp_path):
    d = sharded(tmp_path / "ck")
    (d / "model.safetensors.index.json").write_text('{"weight_map": {"a": ')
    code, doc, _ = verify(str(d))
    assert code == 1
    [msg] = errors_for(doc, "model.safetensors.index.json")
    assert "not valid JSON" in msg and "line 1" in msg


def test_tensor_claimed_twice_and_tensor_not_where_the_index_says(tmp_path):
    shards = {
        "a.safetensors": {"model.embed_tokens.weight": ("BF16", [VOCAB, HIDDEN]), "x": ("F32", [2])},
        "b.safetensors": {"x": ("F32", [2]), "lm_head.weight": ("BF16", [VOCAB, HIDDEN])},
    }
    d = write_checkpoint(tmp_path / "ck", shards, {**CONFIG, "hidden_size_per_layer_input": None})
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    idx["weight_map"]["lm_head.weight"] = "a.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    code, doc, _ = verify(str(d))
    assert code == 1
    msgs = [e["message"] for e in doc["errors"]]
    assert any("'x' is claimed twice: in a.safetensors and b.safetensors" in m for m in msgs), msgs
    assert any(
        "'lm_head.weight'" in m and "puts it in a.safetensors" in m and "it is in b.safetensors" in m for m in msgs
    ), msgs


def test_config_shape_mismatch(tmp_path):
    d = sharded(tmp_path / "ck")
    (d / "config.json").write_text(json.dumps({**CONFIG, "vocab_size": VOCAB + 2}))
    code, doc, _ = verify(str(d))
    assert code == 1
    msgs = errors_for(doc, "config.json")
    assert any("model.language_model.embed_tokens.weight" in m and "vocab_size = 130" in m for m in msgs), msgs
    assert any("lm_head.weight" in m for m in msgs)


def test_ple_table_shapes_numbered_blocks_and_duplicates(tmp_path):
    # numbered row blocks: their rows add up to the table
    blocks = {
        f"model.embed_tokens_per_layer.shard_{i}.weight": ("BF16", [VOCAB // 4, LAYERS * PLE_DIM]) for i in range(4)
    }
    base = {"model.embed_tokens.weight": ("BF16", [VOCAB, HIDDEN]), "lm_head.weight": ("BF16", [VOCAB, HIDDEN])}
    d = write_checkpoint(tmp_path / "num", {"a.safetensors": base, "b.safetensors": blocks}, CONFIG)
    rep = ck.inspect_checkpoint(d)
    assert rep.ready(), rep.problems
    assert rep.ple_bytes == 2 * VOCAB * LAYERS * PLE_DIM and len(rep.ple_tensors) == 4
    # wrong width: the table does not match num_hidden_layers x hidden_size_per_layer_input
    wide = {"embed_tokens_per_layer.shard_.weight": ("BF16", [VOCAB, 3 * PLE_DIM])}
    d2 = write_checkpoint(tmp_path / "wide", {"a.safetensors": base, "b.safetensors": wide}, CONFIG)
    [p] = ck.inspect_checkpoint(d2).errors
    assert "2 x 8 = 16" in p.message
    # stored twice (empty shard index and the plain name)
    d3 = write_checkpoint(
        tmp_path / "twice",
        {
            "a.safetensors": {**base, "embed_tokens_per_layer.weight": ("BF16", [VOCAB, 16])},
            "b.safetensors": {"embed_tokens_per_layer.shard_.weight": ("BF16", [VOCAB, 16])},
        },
        CONFIG,
    )
    assert any("more than once" in p.message for p in ck.inspect_checkpoint(d3).errors)
    # declared by config.json, absent from the checkpoint
    d4 = write_checkpoint(tmp_path / "absent", {"a.safetensors": base}, CONFIG)
    assert any("declares per-layer embeddings" in p.message for p in ck.inspect_checkpoint(d4).errors)


def test_no_index_single_file_and_missing_config(tmp_path):
    d = write_checkpoint(
        tmp_path / "one",
        {"model.safetensors": {"model.embed_tokens.weight": ("BF16", [VOCAB, HIDDEN])}},
        {"vocab_size": VOCAB, "hidden_size": HIDDEN},
        index=False,
    )
    rep = ck.inspect_checkpoint(d)
    assert rep.ready() and rep.index is None and rep.weight_bytes == 2 * VOCAB * HIDDEN
    (d / "config.json").unlink()
    assert any(p.file == "config.json" and "missing" in p.message for p in ck.inspect_checkpoint(d).errors)


# --------------------------------------------------------------------------- not ready: download leftovers


def test_download_leftovers(tmp_path):
    d = sharded(tmp_path / "ck")
    (d / "model-00003-of-00003.safetensors.part").write_bytes(b"x")
    code, doc, _ = verify(str(d))
    assert code == 1 and errors_for(doc, "model-00003-of-00003.safetensors.part")


def test_local_dir_download_leftovers_and_locks(tmp_path):
    d = sharded(tmp_path / "ck")
    meta = d / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    lock = meta / f"{S3}.lock"
    lock.write_text("")
    code, doc, _ = verify(str(d))
    assert code == 0, doc  # a lock that nobody holds: huggingface_hub leaves them behind
    with open(lock) as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # a download in progress holds it
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                (
                    "import json,sys; from builder.serving.checkpoint import inspect_checkpoint as i; "
                    f"print(json.dumps([p.file for p in i({str(d)!r}).errors]))"
                ),
            ],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent.parent,
        )
    held = f".cache/huggingface/download/{S3}.lock (held: a download is running)"
    assert json.loads(child.stdout) == [held], child.stderr
    (meta / f"{S3}.0123abcd.incomplete").write_bytes(b"partial")
    code, doc, _ = verify(str(d))
    assert code == 1 and errors_for(doc, f".cache/huggingface/download/{S3}.0123abcd.incomplete")


# --------------------------------------------------------------------------- content


def test_sha256_sums_match_mismatch_and_cache(tmp_path):
    d = sharded(tmp_path / "ck")
    sums = sha256sum_file(d)
    code, doc, _ = verify(str(d), "--sha256", str(sums), "--jobs", "2")
    assert code == 0, doc
    c = doc["content"]
    assert c["checked"] and c["files"] == 3 and c["hashed_files"] == 3 and c["jobs"] == 2
    # unchanged files are not hashed again
    code, doc, _ = verify(str(d), "--sha256", str(sums))
    assert code == 0 and doc["content"]["hashed_files"] == 0 and doc["content"]["cached_files"] == 3
    # a resumed download rewrites one shard: only that one is hashed again
    p = d / S2
    data = bytearray(p.read_bytes())
    data[-1] ^= 0xFF  # same size, header intact: only the sha256 can tell
    p.write_bytes(bytes(data))
    code, doc, _ = verify(str(d), "--sha256", str(sums))
    assert code == 1 and doc["content"]["hashed_files"] == 1
    [msg] = errors_for(doc, S2)
    assert "does not match" in msg and hashlib.sha256(bytes(data)).hexdigest() in msg


def test_rehash_ignores_a_cache_that_an_identical_stat_would_fool(tmp_path):
    d = sharded(tmp_path / "ck")
    sums = sha256sum_file(d)
    assert verify(str(d), "--sha256", str(sums))[0] == 0
    p = d / S1
    st = p.stat()
    data = bytearray(p.read_bytes())
    data[-1] ^= 0xFF
    with open(p, "r+b") as fh:  # same inode, same size, mtime put back
        fh.write(bytes(data))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert verify(str(d), "--sha256", str(sums))[0] == 0  # documented limit of a stat-keyed cache
    code, doc, _ = verify(str(d), "--sha256", str(sums), "--rehash")
    assert code == 1 and errors_for(doc, S1)
    # --rehash also refreshed the cache: the next plain run knows the new digest
    code, doc, _ = verify(str(d), "--sha256", str(sums))
    assert code == 1 and errors_for(doc, S1) and doc["content"]["hashed_files"] == 0


def _entries(tmp_path: Path, sizes: list[int]) -> list:
    out = []
    for i, n in enumerate(sizes):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(n))
        st = p.stat()
        out.append(ck.FileEntry(p.name, p, p, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev))
    return out


def test_interrupted_hashing_keeps_the_finished_digests(tmp_path):
    files = _entries(tmp_path, [300_000, 200_000, 100_000])
    inv = ck.Inventory(tmp_path, {f.name: f for f in files}, [], [])
    plan = cc.ContentPlan({f.name: "0" * 64 for f in files}, [], "test")
    cache = cc.HashCache(tmp_path / "cache.json")

    def done(entry, digest, err):
        raise KeyboardInterrupt  # Ctrl-C right after the first (largest) file

    with pytest.raises(KeyboardInterrupt):
        cc.verify_content(inv, plan, hasher=cc.Sha256Hasher(1), cache=cache, done=done)
    again = cc.HashCache(tmp_path / "cache.json")
    assert again.get(files[0]) == hashlib.sha256(files[0].path.read_bytes()).hexdigest()
    assert again.get(files[1]) is None and again.get(files[2]) is None


@dataclass(frozen=True)
class Transfers(events.Recorder):
    """A Recorder that keeps the transfer events too, as (name, done, total)."""

    seen: list = field(default_factory=list)

    def transfer(self, name, done, total):
        self.seen.append((name, done, total))


def test_interrupt_stops_every_worker_within_a_block(tmp_path):
    files = []
    for i in range(2):  # sparse: 512 MiB to hash, no disk used
        p = tmp_path / f"sparse{i}"
        with open(p, "wb") as fh:
            fh.truncate(256 << 20)
        st = p.stat()
        files.append(ck.FileEntry(p.name, p, p, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev))

    @dataclass(frozen=True)
    class Interrupting(Transfers):
        def transfer(self, name, done, total):
            super().transfer(name, done, total)
            if len(self.seen) == 3:
                raise KeyboardInterrupt

    rep = Interrupting()
    with pytest.raises(KeyboardInterrupt):
        cc.Sha256Hasher(jobs=2, block=64 << 10).hash_many(files, reporter=rep)
    *hashing, end = rep.seen
    assert end == ("sha256", 512 << 20, 512 << 20)  # the bar ends however the hashing does
    assert max(done for _, done, _ in hashing) < 64 << 20  # of 512 MiB: the other worker stopped too, not at the
    # end of its file


def test_sums_file_must_cover_every_shard(tmp_path):
    d = sharded(tmp_path / "ck")
    sums = sha256sum_file(d, [S1, S2])
    code, doc, _ = verify(str(d), "--sha256", str(sums))
    assert code == 1
    assert "has no sha256 for this shard" in errors_for(doc, S3)[0]


def test_sums_may_name_files_below_the_directory(tmp_path):
    d = sharded(tmp_path / "ck")
    (d / "original").mkdir()
    (d / "original" / "params.json").write_text("{}")
    sums = sha256sum_file(d)
    digest = hashlib.sha256(b"{}").hexdigest()
    sums.write_text(sums.read_text() + f"{digest}  original/params.json\n{digest}  ../outside.json\n")
    code, doc, _ = verify(str(d), "--sha256", str(sums))
    assert code == 1 and doc["content"]["files"] == 4
    assert [e["file"] for e in doc["errors"]] == ["../outside.json"]


def test_sums_formats():
    h = "ab" * 32
    assert cc.parse_sums(f"{h}  ./a.safetensors\n{h.upper()} *b.safetensors\nSHA256 (c.safetensors) = {h}\n", "s") == {
        "a.safetensors": h,
        "b.safetensors": h,
        "c.safetensors": h,
    }


@pytest.mark.parametrize(
    "args,words",
    [
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--sha256", "SUMS", "--hf-cache", "HF"], "not both"),
        (["--sha256", "NOFILE"], "no such file"),
        (["--sha256", "BADSUMS"], "line 2"),
    ],
)
def test_bad_flags_exit_2_and_write_nothing(tmp_path, args, words):
    d = sharded(tmp_path / "ck")
    (tmp_path / "SUMS").write_text(f"{'0' * 64}  {S1}\n")
    (tmp_path / "BADSUMS").write_text(f"{'0' * 64}  {S1}\nnot a sum line\n")
    args = [str(tmp_path / a) if a in ("SUMS", "BADSUMS", "NOFILE", "HF") else a for a in args]
    before = snapshot(tmp_path)
    code, doc, err = verify(str(d), *args)
    assert code == 2 and doc is None and words in err, err
    assert snapshot(tmp_path) == before


def test_missing_directory_is_bad_input(tmp_path):
    code, _, err = verify(str(tmp_path / "nope"))
    assert code == 2 and "does not exist" in err


def _hub_cache(tmp_path: Path) -> tuple[Path, Path]:
    """A Hugging Face hub cache holding the sharded checkpoint: LFS files as blobs named by sha256."""
    src = sharded(tmp_path / "src")
    hub = tmp_path / "hub"
    repo = hub / "models--org--tiny"
    snap = repo / "snapshots" / ("c0ffee" * 6 + "abcd")
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snap.name)
    for p in sorted(src.iterdir()):
        data = p.read_bytes()
        if p.suffix == ".safetensors":
            blob = hashlib.sha256(data).hexdigest()  # LFS: the blob is named by its sha256
        else:  # a regular git file: by its git object id, as git itself computes it
            blob = subprocess.run(
                ["git", "hash-object", str(p)], capture_output=True, text=True, check=True
            ).stdout.strip()
        (repo / "blobs" / blob).write_bytes(data)
        os.symlink(f"../../blobs/{blob}", snap / p.name)
    return hub, snap


def test_hf_hub_cache_lfs_sha256(tmp_path):
    hub, snap = _hub_cache(tmp_path)
    code, doc, _ = verify(str(snap), "--hf-cache", str(hub))
    assert code == 0, doc
    assert doc["content"]["files"] == 3 and doc["content"]["hashed_files"] == 3
    # a corrupt blob (same size) is caught by its name, the LFS sha256
    blob = (snap / S3).resolve()
    data = bytearray(blob.read_bytes())
    data[-2] ^= 1
    blob.write_bytes(bytes(data))
    code, doc, _ = verify(str(snap), "--hf-cache", str(hub / "models--org--tiny"))
    assert code == 1 and "does not match" in errors_for(doc, S3)[0]


def test_hf_hub_cache_checks_config_and_index_by_git_blob_sha1(tmp_path):
    hub, snap = _hub_cache(tmp_path)
    code, doc, _ = verify(str(snap), "--hf-cache", str(hub))
    assert code == 0 and doc["content"]["other_files_checked"] == 2  # config.json, the index
    blob = (snap / "config.json").resolve()
    assert blob.name == cc.git_blob_sha1(blob.read_bytes())
    # same JSON, one space more: vLLM would load it, but it is not the file that was published
    blob.write_text(blob.read_text() + " ")
    code, doc, _ = verify(str(snap), "--hf-cache", str(hub))
    assert code == 1 and "git blob sha1" in errors_for(doc, "config.json")[0]


def test_hf_hub_cache_partial_blob_and_held_lock(tmp_path):
    hub, snap = _hub_cache(tmp_path)
    repo = hub / "models--org--tiny"
    locks = hub / ".locks" / repo.name
    locks.mkdir(parents=True)
    (locks / ("ab" * 32 + ".lock")).write_text("")
    rep = ck.inspect_checkpoint(snap)
    assert rep.ready() and any("none held" in n for n in rep.notes)
    (repo / "blobs" / ("cd" * 32 + ".incomplete")).write_bytes(b"half")
    rep = ck.inspect_checkpoint(snap)
    assert [p.file for p in rep.errors] == [str(repo / "blobs" / ("cd" * 32 + ".incomplete"))]


def test_hf_local_dir_metadata(tmp_path):
    d = sharded(tmp_path / "ck")
    meta = d / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    for p in d.glob("*.safetensors"):
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        (meta / f"{p.name}.metadata").write_text(f"{'1' * 40}\n{digest}\n1712656091.1\n")
    code, doc, _ = verify(str(d), "--hf-cache", str(d))
    assert code == 0, doc
    (meta / f"{S1}.metadata").unlink()
    code, doc, _ = verify(str(d), "--hf-cache", str(d))
    assert code == 1 and "records nothing" in errors_for(doc, S1)[0]


def test_hf_cache_that_is_not_one(tmp_path):
    d = sharded(tmp_path / "ck")
    (tmp_path / "empty").mkdir()
    code, _, err = verify(str(d), "--hf-cache", str(tmp_path / "empty"))
    assert code == 2 and "neither a Hugging Face hub cache" in err


def test_parallel_hashing_agrees_with_hashlib(tmp_path):
    files = []
    for i in range(5):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(300_000 + i * 77_777))
        st = p.stat()
        files.append(ck.FileEntry(p.name, p, p, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev))
    rep = Transfers()
    got = cc.Sha256Hasher(jobs=3, block=64 << 10).hash_many(files, reporter=rep)
    assert got == {f.name: hashlib.sha256(f.path.read_bytes()).hexdigest() for f in files}
    total = sum(f.size for f in files)
    assert [d for _, d, _ in rep.seen] == sorted(d for _, d, _ in rep.seen) and rep.seen[-1] == ("sha256", total, total)
    assert len(rep.seen) == sum(-(-f.size // (64 << 10)) for f in files)  # one a block, the last one the end


# --------------------------------------------------------------------------- header parser vs the safetensors library


@pytest.mark.parametrize(
    "header,data_len",
    [
        ({"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}, 8),
        ({"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}, 4),
        ({"a": {"dtype": "BF16", "shape": [0, 3], "data_offsets": [0, 0]}}, 0),
        ({}, 0),
        ({"a": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]}}, 2),
        ({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, 2),  # half a byte
        ({"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}, 6),  # truncated
        ({"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}, 10),  # trailing
        ({"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [2, 10]}}, 10),  # gap at start
        ({"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 6]}}, 6),  # span != shape
        ({"a": {"dtype": "BF16", "shape": [-2, 2], "data_offsets": [0, 8]}}, 8),
        ({"a": {"dtype": "XX", "shape": [2, 2], "data_offsets": [0, 8]}}, 8),
        ({"__metadata__": {"n": 1}}, 0),
        (
            {
                "a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
                "b": {"dtype": "BF16", "shape": [2], "data_offsets": [6, 10]},
            },
            10,
        ),  # overlap
    ],
)
def test_parser_agrees_with_safetensors(header, data_len):
    raw = json.dumps(header).encode()
    blob = len(raw).to_bytes(8, "little") + raw + b"\0" * data_len
    try:
        safetensors.deserialize(blob)
        lib_ok = True
    except Exception:  # noqa: BLE001
        lib_ok = False
    try:
        ck.parse_header(blob, len(blob), "t.safetensors")
        ours = True
    except ck.HeaderError:
        ours = False
    assert ours == lib_ok


def test_a_tensor_named_twice_in_one_header():
    raw = (
        b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
        b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}'
    )
    blob = len(raw).to_bytes(8, "little") + raw + b"\0" * 8
    with pytest.raises(ck.HeaderError, match="names 'a' twice"):
        ck.parse_header(blob, len(blob), "t.safetensors")


# --------------------------------------------------------------------------- plan sizing


def test_weight_size_for_the_plan(tmp_path):
    d = sharded(tmp_path / "ck")
    exact = sum(expected_bytes().values())
    ws = ck.weight_size(d)
    assert ws.bytes == exact and "headers" in ws.source and ws.notes == ()
    # still downloading: the header is whole, the size still exact, with a note
    p = d / S3
    p.write_bytes(p.read_bytes()[: 200 + 8 + int.from_bytes(p.read_bytes()[:8], "little")])
    ws = ck.weight_size(d)
    assert ws.bytes == exact and "not complete" in ws.notes[0]
    # a shard not there yet: the index's total_size
    p.unlink()
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    idx["metadata"]["total_size"] = 12345
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    ws = ck.weight_size(d)
    assert ws.bytes == 12345 and S3 in ws.notes[0]


# --------------------------------------------------------------------------- smoke and the pipeline refuse a checkpoint
# that is not ready

FAKE_SERVER = Path(__file__).parent / "fake_openai_server.py"


def _marker_server(marker: Path) -> str:
    """A server command that leaves a marker when it is started (and then serves)."""
    import shlex

    return f"sh -c {shlex.quote(f'touch {marker} && exec {sys.executable} {FAKE_SERVER} --port $0')} {{port}}"


def test_smoke_refuses_a_truncated_checkpoint_without_starting_a_server(tmp_path):
    d = sharded(tmp_path / "ck")
    p = d / S3
    p.write_bytes(p.read_bytes()[:-1])
    marker = tmp_path / "server-started"
    log = tmp_path / "server.log"
    args = [
        "smoke",
        "--model",
        str(d),
        "--server-cmd",
        _marker_server(marker),
        "--rounds",
        "1",
        "--concurrency",
        "1",
        "--max-tokens",
        "4",
        "--prompt-tokens",
        "8",
        "--gpu-memory",
        "80GiB",
        "--log-file",
        str(log),
    ]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 13, r.output
    assert "checkpoint not ready" in r.stderr and S3 in r.stderr and "truncated" in r.stderr
    assert not marker.exists() and not log.exists()
    # the escape hatch boots anyway (and the fake server then serves)
    r = CliRunner().invoke(main, args + ["--skip-checkpoint-check"])
    assert marker.exists(), r.output
    assert r.exit_code == 0, r.output


def test_smoke_boots_a_ready_checkpoint(tmp_path):
    d = sharded(tmp_path / "ck")
    marker = tmp_path / "server-started"
    r = CliRunner().invoke(
        main,
        [
            "smoke",
            "--model",
            str(d),
            "--server-cmd",
            _marker_server(marker),
            "--rounds",
            "1",
            "--concurrency",
            "1",
            "--max-tokens",
            "4",
            "--prompt-tokens",
            "8",
            "--gpu-memory",
            "80GiB",
        ],
    )
    assert r.exit_code == 0, r.output
    assert marker.exists() and "checkpoint READY (structure): 3 shard(s)" in r.stderr


def test_pipeline_smoke_refuses_a_missing_shard_before_lock_and_render(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = sharded(tmp_path / "ck")
    (d / S2).unlink()
    spec = tmp_path / "build-image.toml"
    spec.write_text(
        f'vllm = "0.26.0"\nlock = "{tmp_path / "lock" / "requirements.lock"}"\n'
        f'[serving]\nmodel = "{d}"\ngpus = 1\ngpu_memory = "80GiB"\ntp = 1\nmax_model_len = 4096\n'
    )
    out = tmp_path / "ctx"
    r = CliRunner().invoke(main, ["--spec", str(spec), "--smoke", "-o", str(out)])
    assert r.exit_code == 13, r.output
    assert S2 in r.stderr and "missing" in r.stderr
    assert not (tmp_path / "lock").exists() and not out.exists()


# --------------------------------------------------------------------------- real checkpoints, written by transformers


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3-a", "gemma4-ple-numbered", "gemma4-ple-short", "gemma4-ple-ref"])
def test_transformers_checkpoints_are_ready_with_the_loaders_byte_count(tmp_path, name):
    """Needs torch + transformers (the 'checkpoints' extra that scripts/setup.sh installs)."""
    from safetensors.torch import load_file

    from tests.checkpoints import BUILDERS

    d = tmp_path / name
    BUILDERS[name](d)
    code, doc, _ = verify(str(d))
    assert code == 0, doc
    assert doc["notes"] == []  # the embeddings (and the PLE table) were found and checked against config.json
    tensors = {}
    for f in sorted(d.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    assert doc["weight_bytes"] == sum(t.numel() * t.element_size() for t in tensors.values())
    ple = [k for k in tensors if "embed_tokens_per_layer" in k]
    assert doc["ple_tensors"] == sorted(ple)
    assert doc["ple_bytes"] == sum(tensors[k].numel() * tensors[k].element_size() for k in ple)
    assert (doc["ple_bytes"] > 0) == name.startswith("gemma4")


def test_checkpoint_and_plan_read_the_text_settings_of_a_nested_config_by_one_rule():
    """`text_config` (else `llm_config`/`language_config`) with the top level's dtype, quantization and
    tie_word_embeddings: the checkpoint check sees the same settings as the memory plan."""
    from builder.serving.modelconfig import text_config

    inner = {"vocab_size": 8, "hidden_size": 4}
    cfg, problem = text_config(
        {"text_config": inner, "tie_word_embeddings": False, "dtype": "float16", "vision_config": {"hidden_size": 99}}
    )
    assert problem is None and cfg == {**inner, "tie_word_embeddings": False, "dtype": "float16"}
    assert text_config({"llm_config": inner})[0] == inner
    assert text_config({"text_config": {**inner, "dtype": "bfloat16"}, "dtype": "float16"})[0]["dtype"] == "bfloat16"
    flat = {"vocab_size": 8}
    assert text_config(flat) == (flat, None)
    bad = {"text_config": "x", "vocab_size": 8}
    assert text_config(bad) == (bad, "'text_config' must be an object")
