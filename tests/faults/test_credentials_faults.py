"""A password in a --find-links URL never reaches a file, a message or --json; it is found at use
time (the flag's URL in memory, netrc, keyring)."""

from __future__ import annotations

import json
import os

import pytest

from builder.credentials import redact_text, redact_url

from .conftest import cli


@pytest.mark.parametrize(
    "url, want",
    [
        ("http://ci-bot:pw@127.0.0.1:8080/simple/", "http://****@127.0.0.1:8080/simple/"),
        ("https://__token__@pypi.example/simple/", "https://****@pypi.example/simple/"),
        ("https://h/x.whl?token=abc&v=1", "https://h/x.whl?token=****&v=1"),
        (
            "https://s3/x.whl?X-Amz-Signature=sig&X-Amz-Credential=AKIA",
            "https://s3/x.whl?X-Amz-Signature=****&X-Amz-Credential=****",
        ),
        ("https://files.pythonhosted.org/a/b/x.whl", "https://files.pythonhosted.org/a/b/x.whl"),
        ("/srv/wheels", "/srv/wheels"),
    ],
)
def test_redact_url(url, want):
    assert redact_url(url) == want
    assert redact_text(f"cannot fetch {url}: refused") == f"cannot fetch {want}: refused"


def test_password_in_find_links_url_is_never_written(offline, tmp_path, auth_wheel_server):
    srv = auth_wheel_server
    out = tmp_path / "r.lock"
    env = {"BUILD_IMAGE_CACHE": str(tmp_path / "lock-cache"), "NETRC": str(tmp_path / "no-netrc")}

    def with_url(args, url):
        i = args.index("--find-links")
        return args[: i + 1] + [url] + args[i + 2 :]

    r = cli(with_url(offline("--with", "stableabi", "-o", str(out), "--json"), srv.url), env=env)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    written = [p.read_text(errors="replace") for p in out.parent.iterdir() if p.is_file()]  # the lock and its twins
    assert len(written) >= 1
    for where in (*written, r.stdout, r.stderr):
        assert srv.password not in where and srv.user not in where
    assert f"# index: --no-index --find-links http://****@127.0.0.1:{srv.port}/" in text
    assert f"# wheel: http://127.0.0.1:{srv.port}/stableabi-1.0.0" in text  # where it comes from, no secret
    assert any(ok and p.endswith(".whl") for p, ok in srv.hits)  # the binary wheel was fetched (authenticated)
    assert json.loads(r.stdout)["status"] == "written"
    # another password for the same index: the same inputs (a credential is not an input)
    other = srv.url.replace(srv.password, "rotated")
    r = cli(with_url(offline("--with", "stableabi", "-o", str(out), "--check"), other), env=env)
    assert r.returncode == 0, r.stderr

    # render time, another process: no URL carries the secret; netrc does
    from builder.resolve.lockfile import load_lock

    lock = load_lock(out)
    code = (
        "import sys; from builder.resolve.lockfile import load_lock; from builder.image.render import "
        "fetch_wheels\n"
        "from builder.errors import BuildImageError\n"
        f"try: print(sorted(fetch_wheels(load_lock({str(out)!r}))))\n"
        "except BuildImageError as exc: sys.exit(print(exc.render(), file=sys.stderr) or exc.exit_code)"
    )
    import subprocess
    import sys

    fresh = dict(os.environ, BUILD_IMAGE_CACHE=str(tmp_path / "render-cache"), NETRC=str(tmp_path / "no-netrc"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=fresh, timeout=120)
    assert r.returncode == 7 and "no credential was found" in r.stderr and "netrc" in r.stderr, r.stderr
    assert srv.password not in r.stderr
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login {srv.user} password {srv.password}\n")
    netrc.chmod(0o600)
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(fresh, NETRC=str(netrc))
    )
    assert r.returncode == 0, r.stderr
    assert all(e.wheel.filename in r.stdout for e in lock.entries)


def test_a_lock_carrying_a_password_is_redacted_in_the_context(tmp_path):
    from builder.image.render import write_context

    from .conftest import tiny_context

    ctx, plan = tiny_context(tmp_path)
    text = plan.lock.format().replace(
        "# python:", "# index: --find-links https://bot:hunter2@wheels.example/\n# python:"
    )
    wheels = {e.wheel.filename: tmp_path / "wheels-src" / e.wheel.filename for e in plan.lock.entries}
    write_context(ctx, plan, wheels=wheels, lock_text=text)
    got = (ctx / "requirements.lock").read_text()
    assert "hunter2" not in got and "bot:" not in got and "https://****@wheels.example/" in got
