# Debian 12 image with PostgreSQL 15 + pg_co, MariaDB 10.11.18 + mysql_co, the coordinator
# and the Python client; its default command is the demo. Built by the same scripts as a
# development machine (scripts/bootstrap.sh, scripts/build.sh) in a build stage; the
# runtime stage gets only the servers, the two plugins, the daemon and the client.
#
# Checked before each release with Debian's podman, no registry needed:
#   bash scripts/docker-demo.sh        # makes the debian:12 base, builds, runs the demo
# (docs/testing.md, "Release checks": 36 minutes the first time on 2 shared cores, image
# 753 MB).

# ---------------------------------------------------------------------------------------
FROM debian:12 AS build
# Every step fails on the first failing command, including inside pipes. (podman/buildah
# honour SHELL only with --format docker, which scripts/docker-demo.sh passes.)
SHELL ["/bin/bash", "-euo", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PATH=/root/.cargo/bin:$PATH \
    COTX_CACHE=/var/cache/cotx \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt

# Rust 1.95.0 (rust-toolchain.toml) from rustup. The installer is a pinned release checked
# against its SHA-256, downloaded to a file and then run: a failed download stops the
# build here (sh.rustup.rs, the usual `curl | sh` host, may not resolve where
# static.rust-lang.org does). rustfmt: pgrx formats the bindings it generates.
ARG RUSTUP_VERSION=1.28.2
ARG RUSTUP_SHA256=20a06e644b0d9bd2fbdbfd52d42540bdde820ea7df86e92e533c073da0cdd43c
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl build-essential git \
 && curl -fsSL --proto '=https' --tlsv1.2 -o /tmp/rustup-init \
      "https://static.rust-lang.org/rustup/archive/$RUSTUP_VERSION/x86_64-unknown-linux-gnu/rustup-init" \
 && echo "$RUSTUP_SHA256  /tmp/rustup-init" | sha256sum -c --quiet - \
 && chmod +x /tmp/rustup-init \
 && /tmp/rustup-init -y --no-modify-path --profile minimal --default-toolchain 1.95.0 --component rustfmt \
 && rm /tmp/rustup-init \
 && cargo --version

# The bootstrap (Debian packages, cargo-pgrx, the venv, the server sources: 10-20 minutes)
# depends only on these files, so an edit elsewhere reuses this layer.
WORKDIR /opt/cotx
COPY rust-toolchain.toml requirements.txt ./
COPY scripts/lib.sh scripts/bootstrap*.sh scripts/
RUN bash scripts/bootstrap.sh

COPY . .
RUN bash scripts/build.sh \
 && test -x "$COTX_CACHE/bin/cotx-coordinator" \
 && test -f /usr/lib/mysql/plugin/mysql_co.so \
 && test -f "$(/usr/lib/postgresql/15/bin/pg_config --pkglibdir)/pg_co.so"

# ---------------------------------------------------------------------------------------
FROM debian:12
SHELL ["/bin/bash", "-euo", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    COTX_CACHE=/var/cache/cotx
WORKDIR /opt/cotx

# The servers at the exact versions the plugins were compiled against (the bootstrap's
# apt pins), Python for the client and the demo, and the unprivileged user the demo's
# servers run as. Package scripts must not start servers (policy-rc.d), and their default
# data directories are dropped: the demo and tests create their own.
COPY scripts/lib.sh scripts/
COPY requirements.txt ./
COPY --from=build /etc/apt/preferences.d/cotx-pins /etc/apt/preferences.d/cotx-pins
RUN source scripts/lib.sh \
 && printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \
 && apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
      "postgresql-$PG_MAJOR=$PG_VERSION" "postgresql-client-$PG_MAJOR=$PG_VERSION" "libpq5=$PG_VERSION" \
      "mariadb-server=$MARIADB_VERSION" "mariadb-client=$MARIADB_VERSION" \
      python3 python3-venv procps psmisc iproute2 \
 && if [ -d "/etc/postgresql/$PG_MAJOR/main" ]; then pg_dropcluster --stop "$PG_MAJOR" main; fi \
 && rm -rf /var/lib/mysql/* /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb /usr/sbin/policy-rc.d \
 && useradd --system --create-home --home-dir "/var/lib/$COTX_USER" --shell /bin/sh "$COTX_USER" \
 && grep -E '^(psycopg|PyMySQL)' requirements.txt > /tmp/client-requirements.txt \
 && python3 -m venv "$COTX_VENV" \
 && PIP_CERT=/etc/ssl/certs/ca-certificates.crt "$COTX_VENV/bin/pip" install -q --no-cache-dir -r /tmp/client-requirements.txt \
 && rm /tmp/client-requirements.txt \
 && chmod o+rx "$COTX_CACHE" "$COTX_VENV"

# What the build stage installed: the two plugins and the daemon.
COPY --from=build /usr/lib/postgresql/15/lib/pg_co.so /usr/lib/postgresql/15/lib/
COPY --from=build /usr/share/postgresql/15/extension/pg_co* /usr/share/postgresql/15/extension/
COPY --from=build /usr/lib/mysql/plugin/mysql_co.so /usr/lib/mysql/plugin/
COPY --from=build /var/cache/cotx/bin/cotx-coordinator /var/cache/cotx/bin/
COPY deploy/ deploy/
RUN ln -s /var/cache/cotx/bin/cotx-coordinator /usr/local/bin/cotx-coordinator \
 && if ldd /usr/local/bin/cotx-coordinator | grep 'not found'; then exit 1; fi \
 && printf 'token = "only-to-check-the-binary-runs"\n' > /tmp/check.toml \
 && cotx-coordinator check-config --config /tmp/check.toml && rm /tmp/check.toml

# The client, the test harness the demo starts its servers with, the history checker and
# the demo itself: Python sources only.
COPY scripts/ scripts/
COPY clients/python/ clients/python/
COPY harness/ harness/
COPY checker/ checker/
COPY demo/ demo/
RUN chmod -R o+rX /opt/cotx

# The demo starts its own throwaway PostgreSQL, MariaDB and coordinator (as the
# unprivileged user above) and exits 0 when cotx held the invariant. For a long-running
# coordinator: cotx-coordinator serve --config FILE (deploy/coordinator.prod.toml,
# coordinator-daemon/coordinator.example.toml documents every key).
CMD ["bash", "scripts/demo.sh"]
