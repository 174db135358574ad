# Sourced by the device proof scripts (proof-run.sh, serve-proof-run.sh, tp-proof-run.sh):
# where results and logs go, the offline/no-telemetry/NVLink-multicast-off environment, and the
# PYTHONPATHs of the bundle's unpatched and patched vllm.  Sets REPO, P, R, L, CK, say, CUTE,
# PP_UN, PP_PA, VB.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
P=${P:-/tmp/proof}; R=$P/results; L=$P/logs; CK=${CK:-/tmp/ck}
mkdir -p "$R" "$L" "$CK"
say() { echo "$(date -u +%T) $*" | tee -a "$P/progress.txt"; }
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAY_USAGE_STATS_ENABLED=0
CUTE=/tmp/site/nvidia_cutlass_dsl/dsl_packages
PP_UN=/tmp/site:$CUTE:$REPO            # unpatched vllm
PP_PA=/tmp/sitep:/tmp/site:$CUTE:$REPO # patched copy of the vllm package shadows the unpatched one
VB="python3 -m vllm.entrypoints.cli.main"
