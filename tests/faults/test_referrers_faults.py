"""SBOM/provenance referrers on a private docker-registry: attached and found when it accepts
them; a read-only registry refusing them is reported, not a failure, and the files stay."""

from __future__ import annotations

import json
import subprocess

from builder.image.referrers import (
    INTOTO_TYPE,
    OCI_MANIFEST,
    SBOM_TYPE,
    digest_of,
    list_referrers,
    push_attestations,
    upload_blob,
)
from builder.image.registry import RegistryClient
from tests.faults.conftest import OwnRegistry, wait_http


def _push_subject(addr: str, repo: str = "t/img") -> str:
    """A minimal image manifest (one config blob, no layers) pushed over the v2 API; its digest."""
    client = RegistryClient(addr)
    cfg = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    upload_blob(client, repo, cfg)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "layers": [],
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": digest_of(cfg),
                "size": len(cfg),
            },
        }
    ).encode()
    status, _, body = client.request("PUT", f"/v2/{repo}/manifests/v1", {"Content-Type": OCI_MANIFEST}, manifest)
    assert status == 201, body
    return digest_of(manifest)


class ReadOnlyRegistry(OwnRegistry):
    def start(self) -> ReadOnlyRegistry:
        cfg = self.root / "registry-ro.yml"
        cfg.write_text(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {self.root / 'data'}\n  maintenance:\n    readonly:\n      enabled: true\n"
            f"http:\n  addr: {self.addr}\n"
        )
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "registry.log", "ab"),
        )
        assert wait_http(f"http://{self.addr}/v2/"), (self.root / "registry.log").read_text()[-2000:]
        return self


def test_attached_then_found_through_the_referrers_tag_schema(own_registry, tmp_path):
    from tests.test_render import _write

    ctx, _plan = _write(tmp_path / "r")
    digest = _push_subject(own_registry.addr)
    pinned = f"{own_registry.addr}/t/img@{digest}"
    att = push_attestations(ctx, pinned, [f"{own_registry.addr}/t/img:v1"])
    assert att["pushed"] is True and att["referrers"] == "tag-schema", att
    how, found = list_referrers(RegistryClient(own_registry.addr), "t/img", digest)
    assert how == "tag-schema" and sorted(m["artifactType"] for m in found) == sorted([SBOM_TYPE, INTOTO_TYPE])
    prov = json.loads((ctx / "provenance.intoto.json").read_text())
    assert prov["subject"][0]["digest"]["sha256"] == digest.split(":")[1]
    # pushing again keeps one of each (the provenance is rewritten: a new finishedOn, a new digest)
    again = push_attestations(ctx, pinned, [])
    _, found = list_referrers(RegistryClient(own_registry.addr), "t/img", digest)
    assert len(found) == 2 and again["provenance"]["digest"] in {m["digest"] for m in found}


def test_a_registry_that_refuses_them_is_reported_and_the_files_stay(own_registry, tmp_path):
    from tests.test_render import _write

    ctx, _plan = _write(tmp_path / "r")
    digest = _push_subject(own_registry.addr)
    own_registry.kill()
    ro = ReadOnlyRegistry(own_registry.root, port=own_registry.port).start()
    try:
        att = push_attestations(ctx, f"{ro.addr}/t/img@{digest}", [])
    finally:
        ro.kill()
    assert att["pushed"] is False and f"registry {ro.addr} refused" in att["reason"], att
    assert "sbom" not in att and "provenance" not in att
    for key in ("sbom", "provenance"):
        assert (ctx / att["files"][key].rsplit("/", 1)[-1]).is_file()
    # the statement still names the pushed digest: the image is in the registry, its provenance is a file
    prov = json.loads((ctx / "provenance.intoto.json").read_text())
    assert prov["subject"][0]["digest"]["sha256"] == digest.split(":")[1]


def test_signed_sbom_and_provenance_verify_and_sit_where_cosign_looks(own_registry, tmp_path):
    from builder import signing
    from builder.image.referrers import COSIGN_SIGNATURE, CYCLONEDX_PREDICATE, cosign_tag
    from tests.fx_cutover import make_key
    from tests.test_render import _write

    ctx, _plan = _write(tmp_path / "r")
    digest = _push_subject(own_registry.addr)
    priv, pub = make_key(tmp_path / "keys", "ed25519")
    signer = signing.load_signer(priv)
    att = push_attestations(ctx, f"{own_registry.addr}/t/img@{digest}", [], signer)
    assert att["sbom"]["signed"]["signer"] == att["provenance"]["signed"]["signer"] == signer.fingerprint
    client = RegistryClient(own_registry.addr)
    status, _h, body = client.request("GET", f"/v2/t/img/manifests/{cosign_tag(digest)}", {"Accept": OCI_MANIFEST})
    assert status == 200, body
    layers = json.loads(body)["layers"]
    prov_type = json.loads((ctx / "provenance.intoto.json").read_text())["predicateType"]
    assert sorted(x["annotations"]["predicateType"] for x in layers) == sorted([CYCLONEDX_PREDICATE, prov_type])
    trusted = signing.trusted_keys([pub])
    for layer in layers:
        assert layer["mediaType"] == signing.ENVELOPE_TYPE and layer["annotations"][COSIGN_SIGNATURE] == ""
        opened = signing.open_envelope(client.request("GET", f"/v2/t/img/blobs/{layer['digest']}")[2], "t", trusted)
        statement = json.loads(opened.payload)
        assert opened.signers == (signer.fingerprint,) and statement["subject"][0]["digest"]["sha256"] == digest[7:]
    # the unsigned referrers stay for readers that take them as they are; the signed ones are added beside
    _, found = list_referrers(client, "t/img", digest)
    assert len(found) == 4
    # signing again replaces each signed layer instead of piling them up
    push_attestations(ctx, f"{own_registry.addr}/t/img@{digest}", [], signer)
    body = client.request("GET", f"/v2/t/img/manifests/{cosign_tag(digest)}", {"Accept": OCI_MANIFEST})[2]
    assert len(json.loads(body)["layers"]) == 2
