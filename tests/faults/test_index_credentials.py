"""A credential in an index variable (``UV_INDEX_URL=https://user:PW@host/simple``, no port) is a credential,
never a port: every command that reads the variables runs without an internal error, and the password is in
no output and no file it writes (`builder/credentials.py: split_userinfo, request`)."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import pytest

from builder import credentials

from .conftest import cli

PASSWORD = "PW-s3cret-9q"
URL = f"https://ci-bot:{PASSWORD}@127.0.0.1:9/simple"  # nothing listens on port 9 (discard): refused at once
INDEX_VARIABLES = (
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "PIP_INDEX_URL",
    "UV_EXTRA_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "UV_INDEX",
)


def _written(root: Path) -> list[str]:
    return [p.read_bytes().decode("utf-8", "replace") for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def _assert_clean(r, *roots: Path) -> None:
    assert r.returncode not in (70, 1) and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    for where in (r.stdout, r.stderr, *(t for root in roots for t in _written(root))):
        assert PASSWORD not in where and "ci-bot" not in where


@pytest.mark.parametrize("var", INDEX_VARIABLES)
def test_lock_json_with_a_credential_in_an_index_variable(var, offline, tmp_path):
    out = tmp_path / "o" / "r.lock"
    out.parent.mkdir()
    cache = tmp_path / "cache"
    # the default overlay: its ray is chosen from the index the variable names (SimpleIndex), the rest by uv
    args = [a for a in offline("-o", str(out), "--json") if a not in ("--no-index", "--no-default-overlay")]
    env = {var: URL, "BUILD_IMAGE_CACHE": str(cache), "NETRC": str(tmp_path / "none"), "UV_HTTP_RETRIES": "0"}
    r = cli(args, env=env, timeout=300)
    _assert_clean(r, out.parent, cache)


@pytest.mark.parametrize("var", ("UV_INDEX_URL", "PIP_INDEX_URL", "UV_DEFAULT_INDEX"))
def test_base_recipe_and_reconstruct_check_with_a_credential_in_an_index_variable(var, tmp_path):
    cache = tmp_path / "cache"
    env = {var: URL, "BUILD_IMAGE_CACHE": str(cache), "NETRC": str(tmp_path / "none"), "UV_HTTP_RETRIES": "0"}
    for args in (
        ["base", "recipe", "--vllm", "0.26.0", "--json"],
        ["base", "reconstruct", "--vllm", "0.26.0", "--check", "--json"],
    ):
        r = cli(args, env=env, cwd=tmp_path, timeout=300)
        _assert_clean(r, tmp_path)
        assert r.returncode == 7, r.stderr[-2000:]  # the index is unreachable: said so, with the URL redacted
        assert "https://****@127.0.0.1:9/simple" in r.stderr or "127.0.0.1:9" in r.stderr


@pytest.mark.parametrize(
    "url, bare, cred",
    [
        ("https://user:PW@host/simple", "https://host/simple", ("user", "PW")),
        ("https://user:p@ss:w@host:8443/s", "https://host:8443/s", ("user", "p@ss:w")),
        ("https://__token__@host/s", "https://host/s", ("__token__", "")),
        ("https://u:%41b@host/", "https://host/", ("u", "Ab")),
        ("https://host/simple", "https://host/simple", None),
        ("https://u:PW@[::1/s", "https://u:PW@[::1/s", None),  # urllib cannot split it: returned, never raised
    ],
)
def test_split_userinfo_by_structure(url, bare, cred):
    assert credentials.split_userinfo(url) == (bare, cred)


def test_a_request_never_carries_the_userinfo_in_its_url():
    req = credentials.request("https://ci-bot:PW@idx.example/simple/x/", headers={"Accept": "a"})
    assert req.full_url == "https://idx.example/simple/x/" and req.host == "idx.example"
    assert req.get_header("Authorization").startswith("Basic ") and req.get_header("Accept") == "a"
    # a port that is not a number is not an origin anyone remembers: no crash either way
    credentials.remember("https://u:PW@host:notaport/s")
    assert credentials.credential_for("https://host:notaport/s")[0] == "https://host:notaport/s"
    assert urllib.parse.urlsplit(req.full_url).password is None


@pytest.mark.parametrize(
    "text, secret",
    [
        # a message quoting at most N characters of a value cuts a URL before its "@"
        ("field 'https://ci-bot:PW-s3cret-9q", "PW-s3cret-9q"),
        ("got 'https://ci-bot:PW-s3cret-9q'.", "PW-s3cret-9q"),
        # a parser's error snippet cuts the start off ("... PW@host")
        ("    ... PW-s3cret-9q@h.example/x../..\n          ^", "PW-s3cret-9q"),
        # a URL glued to another one's path
        ("https://a.example/xhttps://ci-bot:PW-s3cret-9q@h.example/x", "PW-s3cret-9q"),
    ],
)
def test_redaction_covers_cut_and_glued_urls(text, secret):
    assert secret not in credentials.redact_text(text)


@pytest.mark.parametrize(
    "text",
    [
        "https://host:8080/x",
        "see https://host:8080.",
        "http://[::1]:5000/x",
        "mail a@b.com",
        "repo:tag@sha256:" + "a" * 64,
    ],
)
def test_redaction_leaves_ports_addresses_and_digests(text):
    assert credentials.redact_text(text) == text
