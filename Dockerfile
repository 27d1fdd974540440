# One image for every part of the scaler; compose.yaml runs each as `python -m <part>`.
# PYTHON: any Python 3.11 base with `python`, venv and useradd (`docker compose build --build-arg PYTHON=...`;
# scripts/compose_check.py --stand-ins builds one from Debian packages where no registry is reachable).
ARG PYTHON=python:3.11-slim-bookworm

# Build: generate the gRPC code from scaler/proto/*.proto (the checkout's generated files are not in the
# context, see .dockerignore), then build the wheel and install it with its dependencies in /venv.
FROM ${PYTHON} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# grpcio-tools at the version the `dev` extra pins, so the code matches what `python -m scaler.proto --check` expects.
COPY pyproject.toml .
RUN python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["dev"], sep="\n")' > dev.txt \
 && python -m venv /tools && /tools/bin/pip install -r dev.txt
COPY . .
RUN /tools/bin/python -m scaler.proto \
 && /tools/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /venv && /venv/bin/pip install /wheels/*.whl

# Run: the venv alone, as an unprivileged user. /stats is where the simulator leaves its
# statistics, /secrets where the node keeps its admin key; a named volume mounted there starts with this owner.
FROM ${PYTHON}
RUN useradd --system --user-group --uid 10001 --no-create-home scaler \
 && install -d -o scaler -g scaler /stats /secrets
COPY --from=build /venv /venv
ENV PATH=/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 9001 50051
CMD ["scaler", "up"]
