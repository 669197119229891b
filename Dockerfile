# Debian 12 image with PostgreSQL 15 + pg_co, MariaDB 10.11.18 + mysql_co and the
# coordinator, built by the same scripts as a development machine (scripts/bootstrap.sh,
# scripts/build.sh). Untested: no Docker engine runs where this project is developed.
FROM debian:12

ENV DEBIAN_FRONTEND=noninteractive \
    PATH=/root/.cargo/bin:$PATH \
    COTX_CACHE=/var/cache/cotx

# The bootstrap expects rustup's Rust 1.95.0 (rust-toolchain.toml); the image gets it
# from rustup, which a development machine already has.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl build-essential git \
 && curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain 1.95.0 \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/cotx
COPY . .
RUN bash scripts/bootstrap.sh && bash scripts/build.sh

# The demo starts its own throwaway PostgreSQL, MariaDB and coordinator (as the
# unprivileged user the bootstrap created) and prints a summary. For a long-running
# coordinator, run /var/cache/cotx/bin/cotx-coordinator serve with a config based on
# coordinator-daemon/coordinator.example.toml (it listens on 127.0.0.1:7420 by default).
CMD ["bash", "scripts/demo.sh"]
