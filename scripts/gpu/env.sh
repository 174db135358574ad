# shellcheck shell=bash
# Sourced by the device proof scripts (proof-run.sh, serve-proof-run.sh, tp-proof-run.sh):
# where results and logs go, the offline/no-telemetry/NVLink-multicast-off environment, and the
# PYTHONPATHs of the bundle's unpatched and patched vllm.  Sets REPO, P, R, L, CK, say, CUTE,
# PP_UN, PP_PA, VB.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd); export REPO
P=${P:-/tmp/proof}; R=$P/results; L=$P/logs; CK=${CK:-/tmp/ck}
mkdir -p "$R" "$L" "$CK"
say() { echo "$(date -u +%T) $*" | tee -a "$P/progress.txt"; }
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAY_USAGE_STATS_ENABLED=0
CUTE=/tmp/site/nvidia_cutlass_dsl/dsl_packages
# shellcheck disable=SC2034  # used by the scripts that source this file
PP_UN=/tmp/site:$CUTE:$REPO            # unpatched vllm
# shellcheck disable=SC2034
PP_PA=/tmp/sitep:/tmp/site:$CUTE:$REPO # patched copy of the vllm package shadows the unpatched one
# shellcheck disable=SC2034
VB="python3 -m vllm.entrypoints.cli.main"
# The layered bundle (scripts/gpu/make-bundle.sh; installed into /tmp/L by scripts/gpu/device-calls.sh):
# release_pp V [patched] prints release V's PYTHONPATH: its torch layer first, then (patched) /tmp/L/vllm-V.patched
# (the patched copy of its vllm package), its vllm layer, its ray layer where installed, the vllm layer's
# cutlass DSL packages (a .pth entry that pip --target does not process) and the repo.
release_pp() {
  python3 - "$@" <<'PY'
import json, os, sys
m = json.load(open("/tmp/L/manifest.json"))
v, patched = sys.argv[1], len(sys.argv) > 2
kinds = {m["layers"][n]["kind"]: f"/tmp/L/{n}" for n in m["releases"][v]}
pp = [kinds["torch"]] if "torch" in kinds else []
pp += [f"/tmp/L/vllm-{v}.patched"] if patched else []
pp += [kinds["vllm"]] + ([kinds["ray"]] if os.path.isdir(kinds.get("ray", "/nonexistent")) else [])
pp += [kinds["vllm"] + "/nvidia_cutlass_dsl/dsl_packages", os.environ["REPO"]]
print(":".join(pp))
PY
}
