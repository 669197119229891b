CREATE TABLE IF NOT EXISTS {t}(gtid text PRIMARY KEY, outcome text NOT NULL, branches text NOT NULL,
    decided_ms bigint NOT NULL, node text NOT NULL, source text NOT NULL);
CREATE TABLE IF NOT EXISTS {t}_audit(id bigserial PRIMARY KEY, at_ms bigint NOT NULL, gtid text NOT NULL,
    outcome text NOT NULL, operator text NOT NULL, reason text NOT NULL, result text NOT NULL);
CREATE TABLE IF NOT EXISTS {t}_epochs(node text NOT NULL, nonce bigint NOT NULL, started_ms bigint NOT NULL,
    PRIMARY KEY(node, nonce));
CREATE TABLE IF NOT EXISTS {t}_nodes(node text PRIMARY KEY, holder text NOT NULL, url text NOT NULL,
    expires_ms bigint NOT NULL);
