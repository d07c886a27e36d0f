# Telescope for GPU machines: CUDA 13.0 (devel: flash-attn compiles here), Python 3.12, vLLM 0.33.0,
# flash-attn and every Telescope package with every extra. See docs/gpu.md.
# Status: written by hand, NOT built in this repository (no GPU or image registry in CI).
#
#   docker build -t telescope:latest .
#   docker run --rm --gpus all --ipc=host --shm-size=16g \
#     --ulimit memlock=-1 --ulimit stack=67108864 --ulimit nofile=65536:65536 \
#     -it telescope:latest /bin/bash
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH}

# Ubuntu 24.04's python3 is 3.12 (Megatron-Core needs >= 3.12); bubblewrap: the local code sandbox.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev git build-essential \
      bubblewrap ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv \
 && pip install --upgrade pip setuptools wheel packaging ninja

WORKDIR /opt/telescope
COPY . .

# vLLM first: it pins the torch build that everything else then uses. Pinned to the newest release
# Telescope supports, whose torch is built for this image's CUDA: vLLM 0.33.0 pins torch 2.14.0 (CUDA 13.0
# wheels: cuda-toolkit 13.0.3). A release whose torch is built for another CUDA major (0.17.1: torch 2.10.0,
# CUDA 12.8) needs CUDA_IMAGE to match, or flash-attn and TransformerEngine fail torch's check that nvcc's
# major version matches torch's. The vLLM contract tests (make test-vllm-contract) read this version.
ARG VLLM_SPEC=vllm==0.33.0
RUN pip install "${VLLM_SPEC}"

# Every package with the extras scripts/bootstrap.sh installs (the vllm extra adds the OpenTelemetry
# exporters and NVML). Not Daytona (telescope-sandboxes[daytona], in [all]): its SDK pins OpenTelemetry
# below what Ray's dashboard needs (telescope-sandboxes/README.md); it gets its own venv there.
RUN pip install \
      -e "./telescope-core[torch,inference,ray,math,wandb,tensorboard,mlflow,system,gpu,vllm]" \
      -e ./telescope-fsdp \
      -e "./telescope-megatron[megatron]" \
      -e "./telescope-envs[datasets,math,code]" \
      -e "./telescope-sandboxes[e2b,modal,prime]" \
      -e ./telescope-cli -e .

# flash-attn is an sdist that imports torch while building: no build isolation. MAX_JOBS bounds
# the compiler's memory; TransformerEngine (telescope-megatron[te]) compiles the same way, here with its
# CUDA 13 core library named explicitly (core_cu13: this image's CUDA, as megatron-core's own te extra).
ARG MAX_JOBS=8
ARG WITH_TRANSFORMER_ENGINE=0
RUN MAX_JOBS=${MAX_JOBS} pip install --no-build-isolation "flash-attn>=2.6" \
 && if [ "${WITH_TRANSFORMER_ENGINE}" = "1" ]; then \
      MAX_JOBS=${MAX_JOBS} pip install --no-build-isolation "transformer-engine[core_cu13,pytorch]"; fi

CMD ["/bin/bash"]
