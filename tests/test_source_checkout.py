"""`--source DIR` (a vLLM git checkout): git never runs a program the checkout's configuration names, every
path read stays inside the commit's tree, the files come from the commit (the provenance says whether the
work tree matches), and the version agrees with the checkout's tag."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version

from builder import gitcli
from builder.cli import main
from builder.errors import BadInput
from builder.resolve import sdist
from builder.resolve.checkout import context_path, dev_version, source_version
from builder.resolve.recipe.interpret import OVERSIZE
from tests.fx_sdist import DOCKERFILE, PIPELINE, REQUIREMENTS

FILES = {"docker/Dockerfile": DOCKERFILE, ".buildkite/release-pipeline.yaml": PIPELINE, **REQUIREMENTS}


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    cmd = ["git", "-C", str(repo), "-c", "user.email=t@e", "-c", "user.name=t", "-c", "commit.gpgsign=false"]
    return subprocess.run([*cmd, *args], check=True, capture_output=True, text=True, env=env).stdout.strip()


def _checkout(tmp_path: Path, files: dict[str, str] | None = None, tag: str | None = "v0.99.0") -> Path:
    repo = tmp_path / "vllm"
    for rel, text in (files or FILES).items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    repo.mkdir(exist_ok=True)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "files")
    if tag:
        _git(repo, "tag", tag)
    return repo


def _recipe(*args: str):
    return CliRunner().invoke(main, ["base", "recipe", *args])


HOSTILE_CONFIG = """\
[core]
    fsmonitor = {m}/run fsmonitor
    hooksPath = {m}/hooks
    pager = {m}/run pager
    sshCommand = {m}/run ssh
    editor = {m}/run editor
    askPass = {m}/run askpass
    alternateRefsCommand = {m}/run altrefs
    untrackedCache = true
[diff]
    external = {m}/run diff-external
[diff "evil"]
    textconv = {m}/run textconv
[filter "evil"]
    clean = {m}/run clean
    smudge = {m}/run smudge
    process = {m}/run process
    required = true
[credential]
    helper = !{m}/run credential
[pager]
    describe = {m}/run pager-describe
    rev-parse = {m}/run pager-rev-parse
[include]
    path = {m}/more.config
"""


def _arm(repo: Path, tmp_path: Path) -> Path:
    """Give ``repo`` a configuration whose every program writes a file into the returned folder."""
    m = tmp_path / "marks"
    (m / "hooks").mkdir(parents=True)
    run = m / "run"
    run.write_text(f'#!/bin/sh\necho "$@" >> {m}/RAN\ncat >/dev/null 2>&1 || true\n')
    run.chmod(0o755)
    for hook in ("pre-commit", "post-checkout", "post-index-change", "fsmonitor-watchman", "reference-transaction"):
        for d in (m / "hooks", repo / ".git" / "hooks"):
            (d / hook).write_text(f"#!/bin/sh\necho hook {hook} >> {m}/RAN\n")
            (d / hook).chmod(0o755)
    (m / "more.config").write_text(f"[core]\n    fsmonitor = {m}/run included-fsmonitor\n")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text("* filter=evil diff=evil\n")
    with (repo / ".git" / "config").open("a") as fh:
        fh.write(HOSTILE_CONFIG.format(m=m))
    return m


def test_the_checkouts_git_configuration_runs_nothing(tmp_path):
    repo = _checkout(tmp_path, {**FILES, ".gitattributes": "* filter=evil diff=evil\n"})
    marks = _arm(repo, tmp_path)
    (repo / "docker" / "Dockerfile").write_text(DOCKERFILE + "\n# a local change\n")  # a dirty, racy work tree
    (repo / "untracked.txt").write_text("x")
    r = _recipe("--source", str(repo), "--json")
    assert r.exit_code == 0, r.output
    assert not (marks / "RAN").exists(), (marks / "RAN").read_text()
    doc = json.loads(r.stdout)
    assert "docker/Dockerfile" in doc["sdist"]["work_tree"] and "differs" in doc["sdist"]["work_tree"]
    # the adapter's other readers (diff --git's) get the same rules
    for args in (("diff", "--name-only", "HEAD", "HEAD"), ("cat-file", "blob", "HEAD:docker/Dockerfile")):
        assert gitcli.git(args, cwd=repo).returncode == 0
    assert not (marks / "RAN").exists(), (marks / "RAN").read_text()


def test_the_adapter_refuses_commands_and_arguments_that_run_programs():
    for args in (("status",), ("log",), ("fetch",), ("checkout", "x")):
        with pytest.raises(ValueError):
            gitcli.command_line(list(args))
    for args in (("cat-file", "--textconv", "HEAD:x"), ("describe", "--dirty"), ("diff", "--ext-diff", "a", "b")):
        with pytest.raises(BadInput, match="refused"):
            gitcli.command_line(list(args))
    assert "--ext-diff" in gitcli.command_line(["diff", "a", "--", "--ext-diff"])  # a path after --
    env = gitcli.environment()
    assert env["GIT_CONFIG_GLOBAL"] == "/dev/null" and not any(
        k.startswith("GIT_") and k not in gitcli.ENV for k in env
    )
    argv = gitcli.command_line(["rev-parse", "HEAD"])
    assert "core.fsmonitor=false" in argv and "core.hooksPath=/dev/null" in argv


def test_the_files_come_from_the_commit_not_the_work_tree(tmp_path):
    repo = _checkout(tmp_path)
    commit = _git(repo, "rev-parse", "HEAD")
    clean = json.loads(_recipe("--source", str(repo), "--json").stdout)
    assert clean["sdist"]["commit"] == commit and "holds the files read" in clean["sdist"]["work_tree"]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "Dockerfile").write_text("FROM evil\n")
    os.rename(repo / "docker", tmp_path / "moved")
    (repo / "docker").symlink_to(outside)  # the work tree's docker/ leaves the checkout: never read
    r = _recipe("--source", str(repo), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["sdist"]["sha256"] == clean["sdist"]["sha256"] and doc["final_base_image"] == clean["final_base_image"]
    assert "differs from the commit in docker/Dockerfile" in doc["sdist"]["work_tree"]


@pytest.mark.parametrize("target", ["/etc", "../../..", "../outside"])
def test_a_committed_link_leaving_the_tree_is_refused_naming_it(tmp_path, target):
    repo = _checkout(tmp_path, {k: v for k, v in FILES.items() if not k.startswith("docker/")}, tag=None)
    (repo / "docker").symlink_to(target)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "link")
    _git(repo, "tag", "v0.99.0")
    r = _recipe("--source", str(repo))
    assert r.exit_code == 2, r.output
    assert "docker is a symbolic link" in r.output and "outside the checkout" in r.output


def test_a_link_inside_the_tree_is_followed_and_a_requirement_link_out_is_refused(tmp_path):
    files = {("build/" + k if k.startswith("docker/") else k): v for k, v in FILES.items()}
    repo = _checkout(tmp_path, files, tag=None)
    (repo / "docker").symlink_to("build/docker")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "link")
    _git(repo, "tag", "v0.99.0")
    assert _recipe("--source", str(repo)).exit_code == 0
    (repo / "requirements" / "evil.txt").symlink_to("/etc/passwd")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "evil")
    r = _recipe("--source", str(repo), "--vllm", "0.99.1")
    assert r.exit_code == 2 and "requirements/evil.txt" in r.output and "outside the checkout" in r.output


def test_a_build_file_over_the_bound_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(sdist, "MAX_BUILD_FILE", 1 << 16)
    big = {"tools/big.py": "y" * (1 << 17), "tools/big.sh": "z" * (1 << 17)}
    repo = _checkout(tmp_path, {**FILES, "requirements/huge.txt": "x" * (1 << 17), **big})
    r = _recipe("--source", str(repo))
    assert r.exit_code == 2 and "requirements/huge.txt" in r.output and str(1 << 17) in r.output
    (repo / "requirements" / "huge.txt").unlink()
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "small")
    files = sdist.load_source(repo, "0.99.1")
    with pytest.raises(BadInput, match="tools/big.py"):
        files.text("tools/big.py", "a script")
    # a shell script is read up front; one over the bound is kept as its size, refused where a RUN line runs it
    assert files.files["tools/big.sh"] == f"{OVERSIZE}{1 << 17}"


def test_a_script_is_read_on_demand_and_confined(tmp_path):
    repo = _checkout(tmp_path, {**FILES, "tools/install.py": "print(1)\n", "tools/x/run.sh": "echo\n"})
    files = sdist.load_source(repo)
    assert files.files["tools/x/run.sh"] == "echo\n"  # every shell script, read up front
    assert "tools/install.py" not in files.files
    assert files.text("tools/install.py", "a script") == "print(1)\n"
    assert files.text("./tools/../tools/install.py", "a script") == "print(1)\n"
    for bad in ("../vllm/tools/install.py", "/etc/passwd", "tools/../../x"):
        with pytest.raises(BadInput, match="leaves the build context"):
            files.text(bad, "a script")
    with pytest.raises(BadInput, match="has no tools/none.sh"):
        files.text("tools/none.sh", "a script")


def test_the_version_agrees_with_the_tag(tmp_path):
    repo = _checkout(tmp_path)
    r = _recipe("--source", str(repo), "--vllm", "0.98.0")
    assert r.exit_code == 2 and "0.98.0" in r.output and "v0.99.0" in r.output
    assert _recipe("--source", str(repo), "--vllm", "0.99.0").exit_code == 0
    (repo / "README").write_text("later")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "later")
    commit = _git(repo, "rev-parse", "HEAD")
    doc = json.loads(_recipe("--source", str(repo), "--json").stdout)
    assert doc["vllm"] == f"0.99.1.dev1+g{commit[:9]}" and doc["vllm_wheel"] == "0.99.0"
    vllm_step = [s for s in doc["steps"] if any(r.startswith("vllm==") for r in s.get("requirements", []))]
    assert vllm_step and vllm_step[0]["requirements"] == ["vllm==0.99.0"]  # the tag's wheel stands in
    r = _recipe("--source", str(repo), "--vllm", "0.99.0")  # the tag's release: not what the commit holds
    assert r.exit_code == 2 and "1 commit past the tag v0.99.0" in r.output
    doc = json.loads(_recipe("--source", str(repo), "--vllm", "0.100.0", "--json").stdout)
    assert doc["vllm"] == "0.100.0" and doc["vllm_wheel"] == "0.99.0"
    from builder import values
    from builder.resolve.recipe import derive

    recipe = derive(sdist.load_source(repo))
    assert recipe.wheel_version == "0.99.0"  # what the replay installs and takes its instant from
    assert values.ImageRef(recipe.image, "image") == f"vllm/vllm-openai:v0.99.1.dev1-g{commit[:9]}"


def test_no_tag_and_no_vllm_says_to_pass_vllm(tmp_path):
    repo = _checkout(tmp_path, tag=None)
    r = _recipe("--source", str(repo))
    assert r.exit_code == 2 and "pass --vllm" in r.output and "No names found" not in r.output
    assert _recipe("--source", str(repo), "--vllm", "0.99.0").exit_code == 0
    r = _recipe("--source", str(repo), "--vllm", "../../etc")
    assert r.exit_code == 2 and "not a version" in r.output


def test_not_a_checkout_is_bad_input(tmp_path):
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "Dockerfile").write_text("FROM x\n")
    r = _recipe("--source", str(tmp_path), "--vllm", "0.99.0")
    assert r.exit_code == 2 and "not a git checkout" in r.output


# ----------------------------------------------------------------------------- properties
_TAGS = st.builds(
    lambda rel, pre: ".".join(map(str, rel)) + pre,
    st.lists(st.integers(0, 300), min_size=1, max_size=4),
    st.sampled_from(["", "rc1", "rc7", "a2", "b3", ".post1"]),
)


@given(tag=_TAGS, distance=st.integers(1, 10_000), commit=st.text("0123456789abcdef", min_size=40, max_size=40))
@settings(max_examples=200, deadline=None)
def test_a_development_version_is_after_its_tag_and_names_the_commit(tag, distance, commit):
    v = Version(dev_version(Version(tag), distance, commit))
    assert v > Version(tag) and v.is_devrelease and v.dev == distance and v.local == f"g{commit[:9]}"
    sv = source_version(None, ("v" + tag, distance), commit, "--source X")
    assert sv.version == str(v) and sv.wheel == str(Version(tag))


@given(tag=_TAGS, vllm=_TAGS, distance=st.integers(0, 3))
@settings(max_examples=200, deadline=None)
def test_vllm_is_taken_only_where_it_agrees_with_the_tag(tag, vllm, distance):
    try:
        sv = source_version(vllm, ("v" + tag, distance), "a" * 40, "--source X")
    except BadInput as exc:
        assert vllm in str(exc) and tag in str(exc)
        assert Version(vllm) != Version(tag) if distance == 0 else Version(vllm) <= Version(tag)
    else:
        assert sv.version == vllm
        assert Version(vllm) == Version(tag) if distance == 0 else Version(vllm) > Version(tag)


@given(st.lists(st.sampled_from(["a", "b", "..", ".", "", "c.sh"]), min_size=1, max_size=8), st.booleans())
@settings(max_examples=300, deadline=None)
def test_a_context_path_never_leaves_the_context(parts, absolute):
    rel = ("/" if absolute else "") + "/".join(parts)
    try:
        norm = context_path(rel, "x")
    except BadInput as exc:
        assert "x:" in str(exc)
        return
    assert not absolute and not norm.startswith(("/", "../")) and norm not in ("..", ".", "")
    depth = 0
    for p in rel.split("/"):  # every prefix of the path stays inside
        depth += -1 if p == ".." else (p not in ("", "."))
        assert depth >= 0


# ----------------------------------------------------------------------------- upgrade --sdist/--source
def _upgrade(*args: str):
    return CliRunner().invoke(main, ["upgrade", "--from", "0.34.0", *args])


def test_upgrade_takes_bs_build_files_from_a_checkout(tmp_path, monkeypatch):
    import builder.upgrade as U

    seen = {}

    def fake_upgrade(req, reporter):
        seen.update(vars(req))
        raise SystemExit(0)

    monkeypatch.setattr(U, "upgrade", fake_upgrade)
    repo = _checkout(tmp_path)
    commit = _git(repo, "rev-parse", "HEAD")
    r = _upgrade("--to", "0.99.0", "--source", str(repo))
    assert r.exit_code == 0, r.output
    files = seen["b_files"]
    assert files.vllm == "0.99.0" and files.sdist.filename == f"vllm@{commit}" and not files.wheel
    assert "sdist_path" not in seen and "source" not in seen
    r = _upgrade("--to", "0.98.0", "--source", str(repo))  # --to disagrees with the tag
    assert r.exit_code == 2 and "0.98.0" in r.output and "v0.99.0" in r.output
    (repo / "README").write_text("later")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "later")
    r = _upgrade("--to", "0.100.0", "--source", str(repo))  # main before the release: no wheel holds its code
    assert r.exit_code == 2 and "--to-wheel" in r.output and "not a published release" in r.output
    wheel = tmp_path / "vllm-tree"
    wheel.mkdir()
    seen.clear()
    assert _upgrade("--to", "0.100.0", "--source", str(repo), "--to-wheel", str(wheel)).exit_code == 0
    assert seen["b_files"].vllm == "0.100.0" and seen["b_files"].wheel == "0.99.0"


def test_upgrade_refuses_two_sources_of_bs_base(tmp_path):
    repo = _checkout(tmp_path)
    manifest = tmp_path / "m.json"
    manifest.write_text("{}")
    r = _upgrade("--to", "0.99.0", "--source", str(repo), "--sdist", str(manifest))
    assert r.exit_code == 2 and "give one" in r.output
    r = _upgrade("--to", "0.99.0", "--source", str(repo), "--base-to", str(manifest))
    assert r.exit_code == 2 and "give one" in r.output


def test_reconstruct_replays_the_commits_recipe_with_the_stand_in_wheel(tmp_path, monkeypatch):
    import builder.resolve.reconstruct as R

    seen = {}

    def fake_reconstruct(vllm, **kw):
        seen.update(kw, vllm=vllm)
        raise SystemExit(0)

    monkeypatch.setattr(R, "reconstruct", fake_reconstruct)
    repo = _checkout(tmp_path)
    (repo / "README").write_text("later")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "later")
    r = CliRunner().invoke(main, ["base", "reconstruct", "--source", str(repo), "-o", str(tmp_path / "m.json")])
    assert r.exit_code == 0, r.output
    recipe, files = seen["recipe"], seen["files"]
    assert seen["vllm"] == recipe.vllm == files.vllm and recipe.vllm.startswith("0.99.1.dev1+g")
    assert recipe.wheel_version == "0.99.0" and recipe.sdist.to_json()["commit"] == _git(repo, "rev-parse", "HEAD")
