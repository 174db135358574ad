"""The recipe reader on the shell forms release Dockerfiles write the same install step in.

One step — the torch stack: requirements/cuda.txt from the PyTorch index first, the Python index
as extra, unsafe-first-match, a pre-release branch not taken — written as if/else, as an && / ||
chain, as case/esac, as a heredoc RUN, with a bind-mount rename instead of COPY, with the CUDA tag
computed by ${V%.*}/cut/tr: each must give the same recipe step.  A form whose branch depends on what
the files do not say fails naming its Dockerfile line, unless the user accepts it undecided."""

from __future__ import annotations

import pytest

from builder.errors import BadInput
from builder.resolve import recipe as R
from builder.resolve import sedit
from tests.fx_sdist import DOCKERFILE, PIPELINE, REQUIREMENTS, build_files

SHA = "0" * 64
START = "COPY requirements/cuda.txt /tmp/requirements-cuda.txt\n"
END = "ARG JIT_VERSION=0.6.14\n"
TAIL = (
    "--index-url ${PYTORCH_CUDA_INDEX_BASE_URL}/cu$(echo $CUDA_VERSION | cut -d. -f1,2 | tr -d '.') "
    "--extra-index-url https://pypi.org/simple --index-strategy unsafe-first-match"
)
REQS = {**REQUIREMENTS, "requirements/rubin.txt": "torch==9.9.9\n"}

FORMS = {
    "if/else": START
    + """\
ARG INSTALL_RUBIN=false
RUN --mount=type=cache,target=/opt/uv/cache \\
    if [ "${INSTALL_RUBIN}" = "true" ] && [ ! -f /tmp/vllm-requirements/rubin.txt ]; then \\
        echo "rubin needs its file" >&2; exit 1; \\
    fi && \\
    if [ "${INSTALL_RUBIN}" = "true" ]; then \\
        uv pip install --system --prerelease=allow -r requirements/rubin.txt; \\
    else \\
        uv pip install --system -r /tmp/requirements-cuda.txt """
    + TAIL
    + """; \\
    fi && \\
    rm /tmp/requirements-cuda.txt
""",
    "&& || chain": START
    + """\
ARG INSTALL_RUBIN=false
RUN [ "$INSTALL_RUBIN" = "true" ] && uv pip install --system --pre -r requirements/rubin.txt \\
    || uv pip install --system -r /tmp/requirements-cuda.txt """
    + TAIL
    + """
""",
    "case": START
    + """\
ARG INSTALL_RUBIN=false
RUN case "${INSTALL_RUBIN}" in \\
      true|yes) uv pip install --system --pre -r requirements/rubin.txt ;; \\
      *) uv pip install --system -r /tmp/requirements-cuda.txt """
    + TAIL
    + """ ;; \\
    esac
""",
    "heredoc": START
    + """\
ARG INSTALL_RUBIN=false
RUN --mount=type=cache,target=/opt/uv/cache <<EOF
set -eu
if [ "${INSTALL_RUBIN}" = "true" ]; then
    uv pip install --system --pre -r requirements/rubin.txt
else
    uv pip install --system -r /tmp/requirements-cuda.txt """
    + TAIL
    + """
fi
EOF
""",
    "bind-mount rename": """\
ARG INSTALL_RUBIN=false
RUN --mount=type=bind,source=requirements/cuda.txt,target=/tmp/requirements-cuda.txt \\
    if [ "${INSTALL_RUBIN}" != "true" ]; then \\
        uv pip install --system -r /tmp/requirements-cuda.txt """
    + TAIL
    + """; \\
    fi
""",
    "tag from ${V%.*} and tr": START
    + """\
ARG INSTALL_RUBIN=false
RUN CUDA_MM="${CUDA_VERSION%.*}" && \\
    TAG=cu$(echo $CUDA_MM | tr -d '.') && \\
    if [ "${CUDA_MM%%.*}" -ge 13 ] && [ "$INSTALL_RUBIN" = "false" ]; then \\
        uv pip install --system -r /tmp/requirements-cuda.txt \\
            --index-url ${PYTORCH_CUDA_INDEX_BASE_URL}/${TAG} \\
            --extra-index-url=https://pypi.org/simple --index-strategy=unsafe-first-match; \\
    fi
""",
}


def with_torch_step(form: str) -> str:
    i, j = DOCKERFILE.index(START), DOCKERFILE.index(END)
    return DOCKERFILE[:i] + form + DOCKERFILE[j:]


def derive(dockerfile: str, **kw) -> R.Recipe:
    return R.derive(
        R.BuildFiles("0.99.0", R.SdistRef("vllm-0.99.0.tar.gz", SHA), build_files(dockerfile, PIPELINE, REQS)), **kw
    )


def torch_step(r: R.Recipe) -> R.Step:
    steps = [s for s in r.steps if "requirements/cuda.txt" in s.requirement_files]
    assert len(steps) == 1, [s.to_json() for s in r.steps]
    return steps[0]


def comparable(s: R.Step) -> dict:
    d = s.to_json()
    for k in ("n", "from", "fallback"):
        d.pop(k, None)
    return d


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_shell_form_of_the_torch_step_gives_the_same_recipe_step(form):
    step = torch_step(derive(with_torch_step(FORMS[form])))
    want = {
        "stage": "vllm-runtime-base",
        "replay": "index",
        "installer": "uv",
        "requirement_files": ["requirements/cuda.txt"],
        "extra_index_urls": ["https://pypi.org/simple"],
        "file_indexes": ["https://jit.example.invalid/whl/ (requirements/cuda.txt:2)"],
        "overrides": ["nvidia-nccl-cu13==2.30.7"],
        "index_url": "https://download.example.invalid/whl/cu130",
        "index_strategy": "unsafe-first-match",
    }
    got = comparable(step)
    got.pop("overrides_from", None)
    assert got == want
    # no step of unknown content anywhere in the recipe: every step names what it installs
    assert all(s.requirements or s.requirement_files or s.names for s in derive(with_torch_step(FORMS[form])).steps)


def test_the_forms_agree_with_each_other_not_only_with_the_expectation():
    steps = {f: comparable(torch_step(derive(with_torch_step(FORMS[f])))) for f in FORMS}
    for s in steps.values():
        s.pop("overrides_from", None)
    assert len({repr(sorted(s.items())) for s in steps.values()}) == 1


def test_the_taken_branch_follows_the_build_arg():
    # the same if/else with the pre-release branch taken installs the other file, without the PyTorch index
    df = with_torch_step(FORMS["case"]).replace("ARG INSTALL_RUBIN=false", "ARG INSTALL_RUBIN=yes")
    r = derive(df)
    assert not [s for s in r.steps if "requirements/cuda.txt" in s.requirement_files]
    rubin = [s for s in r.steps if "requirements/rubin.txt" in s.requirement_files]
    assert len(rubin) == 1 and rubin[0].flags == ("--pre",) and rubin[0].index_url is None


def test_a_sed_edit_under_a_true_condition_is_carried_and_applied_by_the_replay():
    form = (
        START
        + """\
RUN if [ "$(echo $CUDA_VERSION | cut -d. -f1)" = "13" ]; then \\
        sed -i 's/^jit-cubin==/jit-cubin>=/' /tmp/requirements-cuda.txt; \\
        sed -Ei '/^[[:space:]]*(torch|torchvision)[[:space:]]*==/Id' /tmp/requirements-cuda.txt; \\
    fi && \\
    uv pip install --system -r /tmp/requirements-cuda.txt
"""
    )
    step = torch_step(derive(with_torch_step(form)))
    edits = [(f, s, e) for f, s, e, _w in step.requirement_edits]
    assert edits == [
        ("requirements/cuda.txt", "s/^jit-cubin==/jit-cubin>=/", False),
        ("requirements/cuda.txt", "/^[[:space:]]*(torch|torchvision)[[:space:]]*==/Id", True),
    ]
    text = REQUIREMENTS["requirements/cuda.txt"]
    for _f, s, e in edits:
        text = sedit.apply(text, sedit.parse(s, ere=e))
    assert "torch==" not in text and "jit-cubin>=0.6.14" in text and "-r common.txt" in text
    # the same edits under a false condition are not carried
    step = torch_step(derive(with_torch_step(form.replace('= "13"', '= "12"'))))
    assert step.requirement_edits == ()


@pytest.mark.parametrize(
    "snippet, construct",
    [
        (
            'RUN if [ "$(uname -m)" = "x86_64" ]; then uv pip install --system -r /tmp/requirements-cuda.txt; fi\n',
            "uname -m",
        ),
        (
            'RUN case "$(uname -m)" in x86_64) uv pip install --system -r /tmp/requirements-cuda.txt ;; esac\n',
            "uname -m",
        ),
        (
            'RUN if [ "$UNDECLARED" = "1" ]; then uv pip install --system -r /tmp/requirements-cuda.txt; fi\n',
            "$UNDECLARED",
        ),
        (
            "RUN sed -i 'y/abc/xyz/' /tmp/requirements-cuda.txt && uv pip install --system -r "
            "/tmp/requirements-cuda.txt\n",
            "sed",
        ),
        ("RUN uv pip install --system --index-url https://download.example.invalid/whl/cu130\n", "nothing nameable"),
        ("RUN for f in a b; do uv pip install --system $f; done\n", "compound command"),
    ],
)
def test_an_undecidable_form_fails_naming_its_line_and_the_construct(snippet, construct):
    df = with_torch_step(START + snippet)
    line = df.splitlines().index(snippet.splitlines()[0]) + 1
    with pytest.raises(BadInput) as exc:
        derive(df)
    msg = str(exc.value)
    assert f"docker/Dockerfile:{line}" in msg and construct in msg
    assert "--accept-undecided" in (exc.value.hint or "")


def test_an_accepted_undecided_line_is_a_step_replayed_as_nothing_and_listed():
    snippet = 'RUN if [ "$(uname -m)" = "x86_64" ]; then uv pip install --system -r /tmp/requirements-cuda.txt; fi\n'
    df = with_torch_step(START + snippet)
    line = df.splitlines().index(snippet.rstrip("\n")) + 1
    r = derive(df, accept_undecided=[f"docker/Dockerfile:{line}"])
    und = [s for s in r.steps if s.replay == "undecided"]
    assert len(und) == 1 and str(und[0].where) == f"docker/Dockerfile:{line}" and "uname -m" in und[0].note
    # another line is not accepted by it
    with pytest.raises(BadInput):
        derive(df, accept_undecided=[f"docker/Dockerfile:{line + 1}"])


def test_an_install_from_another_index_only_names_what_its_file_lists():
    form = START + (
        "RUN uv pip install --system -r /tmp/requirements-cuda.txt "
        "--index-url https://download.example.invalid/whl/cu130\n"
    )
    step = torch_step(derive(with_torch_step(form)))
    assert step.replay == "off-index" and step.names == ("torch", "jit-cubin")


@pytest.mark.parametrize(
    "cmd, value",
    [
        ("echo $V | cut -d. -f1", "13"),
        ("echo $V | cut -d. -f2-", "0.2"),
        ("echo $V | cut -d . -f 1,2", "13.0"),
        ("echo $V | cut -d. -f1,2 | tr -d '.'", "130"),
        ("echo $V | tr '.' '_'", "13_0_2"),
        ("echo ${V%.*} | tr -d .", "130"),
    ],
)
def test_command_substitution_pipelines_over_known_values(cmd, value):
    assert R.substitute(cmd, {"V": "13.0.2"}.__getitem__) == value


@pytest.mark.parametrize(
    "cmd", ["uname -m", "echo $V | awk '{print $1}'", "echo $V | tr a-z A-Z", "cat /etc/x", "echo -n $V"]
)
def test_other_substitutions_are_unknown(cmd):
    with pytest.raises(R.Unknown):
        R.substitute(cmd, {"V": "13.0.2"}.__getitem__)


@pytest.mark.parametrize(
    "script, ere, text, out",
    [
        ("s/^a/b/", False, "a1\nxa\n", "b1\nxa\n"),
        ("s/a/b/g", False, "aaa\n", "bbb\n"),
        (r"s/\(x\)y/\1\1/", False, "xy\n", "xx\n"),
        ("s/(x)y/&&/", True, "xy\n", "xyxy\n"),
        ("/^#/d", False, "#c\nk\n", "k\n"),
        ("/^torch==/Id", False, "Torch==1\ntorchaudio==2\n", "torchaudio==2\n"),
        ("s|a|b|", False, "a\n", "b\n"),
    ],
)
def test_the_sed_subset(script, ere, text, out):
    assert sedit.apply(text, sedit.parse(script, ere=ere)) == out


@pytest.mark.parametrize("script", ["y/ab/cd/", "s/a/b/2", "p", "s/a/b", "/x/", "s/[[:punct:]]/x/"])
def test_sed_outside_the_subset_is_refused(script):
    with pytest.raises(sedit.SedUnknown):
        sedit.parse(script)
