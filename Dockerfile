# One image for every pyprovlib entry point: `python -m pyprovlib.<module> ...`.
#
#   docker build -t pyprovlib:dev .
#   docker run --rm pyprovlib:dev                                   # the hostpath demo
#   docker run --rm pyprovlib:dev pyprovlib.csi.provisioner --help  # any other entry point
#
# In a manifest: `command: ["python", "-m", "pyprovlib.examples.hostpath"]` and `args: [...]`.
# PYTHON_IMAGE picks the base (any Debian-based image with python3 >= 3.11); EXTRA_PACKAGES adds
# Debian packages to the final image, e.g. `--build-arg EXTRA_PACKAGES=ceph-common` for the
# RBD example, which runs the `rbd` command.
ARG PYTHON_IMAGE=python:3.11-slim

# --- build: a wheel of pyprovlib and of each dependency, installed into a virtualenv ----------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY src/ src/
RUN python3 -m pip wheel --no-cache-dir --wheel-dir /wheels . \
    && python3 -m venv --without-pip /opt/pyprovlib \
    && python3 -m pip --python /opt/pyprovlib/bin/python install --no-cache-dir --no-index \
        --find-links /wheels /wheels/pyprovlib-*.whl

# --- runtime: the base, the virtualenv and an unprivileged user; no compilers, wheels or caches -
FROM ${PYTHON_IMAGE}
ARG EXTRA_PACKAGES=""
# Versions are the builder's choice here (EXTRA_PACKAGES="ceph-common=<version>" pins one).
# hadolint ignore=DL3008
RUN if [ -n "${EXTRA_PACKAGES}" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends ${EXTRA_PACKAGES} \
        && apt-get clean \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && groupadd --gid 65532 pyprovlib \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin pyprovlib
COPY --from=build /opt/pyprovlib /opt/pyprovlib
ENV PATH=/opt/pyprovlib/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["python", "-m"]
CMD ["pyprovlib.examples.hostpath", "--demo"]
