#!/usr/bin/env bash
# Started by image-proof.sh launch (in the background): the images pulled from the registry by digest, the
# checkpoints made inside the patched image, the smokes through podman with CDI GPUs (attested and signed), then
# promote of the patched image, a refused promote, the unpatched image promoted (forced where its verdict does not
# clear the target), rollback to the patched one and history, on those verdicts.  Progress in $P/progress.txt, one line per
# step with its seconds; reports in $P/results, server logs in $P/logs.
set -uo pipefail
REPO=/tmp/repo-run; cd "$REPO"  # build-image finds the shipped releases in the checkout it runs from
P=${P:-/tmp/iproof}; R=$P/results; L=$P/logs; CK=/tmp/ck
mkdir -p "$R" "$L" "$CK" "$P/keys" "$P/spec" "$P/kuberay"
say() { echo "$(date -u +%T) $*" | tee -a "$P/progress.txt"; }
DEBS=/nonexistent . "$REPO/scripts/gpu/podman-env.sh" > /dev/null
export PYTHONPATH=/tmp/bi-site:$REPO BUILD_IMAGE_ENGINE=podman XDG_STATE_HOME=$P/state XDG_CACHE_HOME=$P/cache
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bi() { python3 -c 'from builder.cli import main; main()' "$@"; }
img() { python3 -c "import json,sys; print(json.load(open('$P/images.json'))[sys.argv[1]])" "$1"; }
PI=$(img patched); UI=$(img unpatched); LOCK=$(ls "$P"/*.lock | head -1)
T0=$(date +%s); lap() { echo $(( $(date +%s) - T0 )); }
say "images: patched $PI; unpatched $UI"

t=$(date +%s)
for ref in "$PI" "$UI"; do podman pull --tls-verify=false "$ref" > "$L/pull.log" 2>&1 || { say "pull FAILED: $ref"; tail -5 "$L/pull.log" | tee -a "$P/progress.txt"; }; done
podman images --digests --format '{{.Repository}}@{{.Digest}} {{.ID}} {{.Size}}' | tee "$R/podman-images.txt" >> "$P/progress.txt"
say "pulled both images through the registry in $(( $(date +%s) - t )) s"

t=$(date +%s)
podman run --rm --pull=never --network=none -v "$REPO:/repo:ro" -v "$CK:/ck" -w /repo --entrypoint python3 "$PI" \
  -m tests.checkpoints /ck qwen3-sparse gemma4-ple-long > "$L/checkpoints.log" 2>&1 \
  && say "checkpoints made inside the patched image in $(( $(date +%s) - t )) s" \
  || { say "checkpoints FAILED"; tail -20 "$L/checkpoints.log" | tee -a "$P/progress.txt"; }

python3 - "$P/keys" <<'PY'
import os, sys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
k = ec.generate_private_key(ec.SECP256R1())
d = sys.argv[1]
fd = os.open(f"{d}/sign.pem", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.write(fd, k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
os.close(fd)
open(f"{d}/trusted.pem", "wb").write(k.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
PY
KEY=$P/keys/sign.pem; PUB=$P/keys/trusted.pem

COMMONQ=(--max-model-len 4096 --max-num-seqs 32 --extra-arg=--enforce-eager --boot-timeout 420 --timeout 120 --concurrency 16 --rounds 3 --max-tokens 64 --prompt-tokens 128)
GT=(--gpu-memory-utilization 0.5 --extra-arg=--max-num-batched-tokens --extra-arg=8192 --no-plan "${COMMONQ[@]}")
SMALLQ=(--gpu-memory-utilization 0.08 --no-plan --extra-arg=--kv-cache-memory --extra-arg=2147483648 "${COMMONQ[@]}")
PAR=(--gpu-memory-utilization 0.08 --no-plan --extra-arg=--kv-cache-memory --extra-arg=2147483648 --max-model-len 2048 --extra-arg=--enforce-eager --boot-timeout 420 --timeout 120 --concurrency 16 --rounds 3 --max-tokens 64 --prompt-tokens 128)
smoke() {  # smoke NAME IMAGE ARGS...
  local name=$1 image=$2 t rc; shift 2; t=$(date +%s)
  # the replay has no FlashInfer (flashinfer-python 0.7.3 is served only by download.pytorch.org): vLLM 0.34.0's
  # sampler imports it at engine start unless told not to
  bi smoke "$image" --vllm 0.34.0 --env VLLM_USE_FLASHINFER_SAMPLER=0 --log-file "$L/$name.log" --attest --sign-key "$KEY" --json "$@" > "$R/$name.json" 2> "$L/$name.smoke.txt"
  rc=$?
  say "$name: exit $rc in $(( $(date +%s) - t )) s: $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r.get('verdict'), r.get('failure') or '', (r.get('attestation') or {}).get('digest',''))" "$R/$name.json" 2>&1 | head -c 400)"
}
say "smoke: patched image, layer-type checkpoint, alone (plan against vLLM's log)"
smoke p-qwen3-sparse "$PI" --model "$CK/qwen3-sparse" "${GT[@]}"
say "smoke: unpatched image on the layer-type checkpoint, both images on the PLE long-name checkpoint, together"
smoke u-qwen3-sparse "$UI" --model "$CK/qwen3-sparse" --skip-checkpoint-check "${SMALLQ[@]}" &
smoke p-gemma4-ple-long "$PI" --model "$CK/gemma4-ple-long" "${PAR[@]}" &
smoke u-gemma4-ple-long "$UI" --model "$CK/gemma4-ple-long" --skip-checkpoint-check "${PAR[@]}" &
wait
say "smokes done at +$(lap) s"

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
ck_sha() {  # the checkpoint's identity as smoke --attest records it: its safetensors index, else its one file
  local d=$CK/$1
  if [ -f "$d/model.safetensors.index.json" ]; then sha256sum "$d/model.safetensors.index.json"; else sha256sum "$d/model.safetensors"; fi | cut -c1-64
}
spec() {  # spec DIR CHECKPOINT MAX_MODEL_LEN
  mkdir -p "$1"; cp "$PUB" "$1/trusted.pem"
  printf '[serving]\nmodel = "/models/%s"\ntp = 1\nmax_model_len = %s\nconcurrency = 16\ngpu_model = "%s"\ncheckpoint_sha256 = "%s"\ntrusted_keys = ["trusted.pem"]\n' \
    "$2" "$3" "$gpu" "$(ck_sha "$2")" > "$1/build-image.toml"
}
spec "$P/spec/qwen" qwen3-sparse 4096; spec "$P/spec/ple" gemma4-ple-long 2048
TO=127.0.0.1:5001/serving/deploy:prod
step() {  # step NAME ARGS...: a cutover command, its JSON kept, its exit code said
  local name=$1 t rc; shift; t=$(date +%s)
  bi "$@" > "$R/$name.json" 2> "$L/$name.txt"; rc=$?; RC=$rc
  say "$name: exit $rc in $(( $(date +%s) - t )) s: $(tail -c 300 "$L/$name.txt" | tr '\n' ' ')"
}
step promote-patched promote "$PI" --to "$TO" --spec "$P/spec/qwen/build-image.toml" --lock "$LOCK" --sign-key "$KEY" -o "$P/kuberay/1" --json
step promote-unpatched-ple-refused promote "$UI" --to "$TO" --spec "$P/spec/ple/build-image.toml" --lock "$LOCK" --sign-key "$KEY" --json
step promote-unpatched promote "$UI" --to "$TO" --spec "$P/spec/qwen/build-image.toml" --lock "$LOCK" --sign-key "$KEY" -o "$P/kuberay/2" --json
if [ "$RC" != 0 ]; then
  step promote-unpatched-forced promote "$UI" --to "$TO" --spec "$P/spec/qwen/build-image.toml" --lock "$LOCK" --sign-key "$KEY" \
    --force --reason "rollback drill on the GPU machine: the unpatched image's verdict does not clear the target" -o "$P/kuberay/2" --json
fi
step rollback rollback "$TO" --trusted-key "$PUB" -o "$P/kuberay/3" --json
step history history "$TO" --json
bi history "$TO" >> "$P/progress.txt" 2>&1
for f in "$L"/*.log; do [ -s "$f" ] && { gzip -c "$f" > "$f.gz" && rm "$f"; }; done
say "PROOF DONE at +$(lap) s"
