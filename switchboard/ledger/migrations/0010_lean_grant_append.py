# A named claim cycle's two ledger rows, cheaper to write (issue 13). A profile of the database
# backend running named claim+complete cycles (claim_profile --named --history; perf and
# pg_stat_user_functions) put ledger_append_row, called twice per cycle (the grant row and the
# end row), at ~650 us of its ~2,650 us of CPU per cycle:
#
# - the row's CHECKs: PostgreSQL reads each CHECK of a table back from its node text and
#   prepares it in every statement that inserts a row (ExecConstraints, stringToNode), and
#   Django's ``kind IN (...)`` of 21 kinds is an array of 21 casts. Here ledger_kind_valid and
#   ledger_chain_valid say the same in one array constant each (switchboard.constraints): same
#   names, same rows accepted and refused.
# - the function ran five SQL statements (set_config by PERFORM, the head's read, the insert,
#   the head's update, the head's signature in a SQL function that was not inlined), each with
#   its executor started and ended. Now: set_config by assignment (an expression, no executor),
#   and one statement that reads the head, draws the seq, hashes, inserts the row and moves the
#   signed head. It is still a statement of its own after the chain's lock, so its snapshot sees
#   the head the lock's last holder committed, and seq is still drawn after that lock.
#
# The row is byte for byte what 0009's function wrote: the same canonical JSON message (members
# in the same order, the same to_char of the same clock_timestamp()), the same HMAC, the same
# head signature (ledger_head_mac's expression, written inline). ledger_head_mac and
# ledger_genesis stay as they are. tests/ledger and tests/limits/test_grant_chains.py verify the
# chains these rows make; chain.verify recomputes every hash in Python.

from importlib import import_module

import switchboard.constraints
from django.db import migrations, models

_0009 = import_module("switchboard.ledger.migrations.0009_grant_chains")

APPEND_LOCK_KEY = 0x6C6564676572
GRANT_CHAINS = 8

APPEND_FUNCTION = r"""
CREATE OR REPLACE FUNCTION ledger_append_row(
    p_kind text, p_actor text, p_human_id bigint, p_human_name text, p_endpoint_id uuid,
    p_endpoint_slug text, p_scope text, p_queue text, p_after text, p_ipad bytea, p_opad bytea
) RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    l_held text := current_setting('switchboard.ledger_chain', true);
    l_chain int;
    l_start int;
    l_genesis boolean := false;
    l_hash text;
BEGIN
    IF p_kind NOT IN ('limits.grant', 'limits.end') OR p_scope !~ '^[A-Za-z0-9._:-]*$'
       OR p_queue !~ '^[A-Za-z0-9._:-]*$' THEN
        RAISE EXCEPTION 'ledger_append_row: a grant or end row, scope and queue needing no escaping';
    END IF;
    IF coalesce(l_held, '') <> '' THEN
        l_chain := l_held::int;
    ELSE
        l_start := pg_backend_pid() %% %(chains)s;
        FOR i IN 0..%(chains)s - 1 LOOP
            IF pg_try_advisory_xact_lock(%(lock)s + 1 + (l_start + i) %% %(chains)s) THEN
                l_chain := 1 + (l_start + i) %% %(chains)s;
                EXIT;
            END IF;
        END LOOP;
        IF l_chain IS NULL THEN
            l_chain := 1 + l_start;
            PERFORM pg_advisory_xact_lock(%(lock)s + l_chain);
        END IF;
        l_held := set_config('switchboard.ledger_chain', l_chain::text, true);
    END IF;
    LOOP
        -- One statement after the lock (a fresh snapshot: the head the lock's last holder
        -- wrote): the next position and seq, the row's HMAC, the row, the signed head. A chain
        -- with no rows yet (chain_pos 0) writes nothing here until ledger_genesis has run.
        WITH h AS MATERIALIZED (
            SELECT hd.chain_pos + 1 AS pos, hd.entry_hash AS prev,
                   nextval('ledger_seq') AS seq, clock_timestamp() AS at
            FROM admission_ledgerhead hd
            WHERE hd.id = l_chain AND (hd.chain_pos > 0 OR l_genesis)
        ), m AS MATERIALIZED (
            SELECT h.pos, h.prev, h.seq, h.at,
                   encode(sha256(p_opad || sha256(p_ipad || convert_to(
                       '{' || p_actor || ',"after":' || coalesce(p_after, 'null')
                       || ',"at":"' || to_char(h.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                       || '+00:00","before":null'
                       || CASE WHEN l_chain <> 0
                               THEN ',"chain":' || l_chain || ',"chain_pos":' || h.pos
                               ELSE '' END
                       || ',"kind":"' || p_kind
                       || '","prev_hash":"' || h.prev || '","queue":"' || p_queue
                       || '","scope":"' || p_scope || '","seq":' || h.seq || '}',
                       'UTF8'))), 'hex') AS hash
            FROM h
        ), row_written AS (
            INSERT INTO admission_ledgerentry (seq, chain, chain_pos, prev_hash, kind,
                actor_human_id, actor_human_name, actor_endpoint_id, actor_endpoint_slug, scope,
                queue, before, after, at, entry_hash)
            SELECT m.seq, l_chain, m.pos, m.prev, p_kind, p_human_id, p_human_name,
                   p_endpoint_id, p_endpoint_slug, p_scope, p_queue, NULL, p_after::jsonb,
                   m.at, m.hash
            FROM m
        )
        UPDATE admission_ledgerhead hd
        SET seq = m.seq, chain_pos = m.pos, entry_hash = m.hash,
            -- ledger_head_mac(l_chain, m.pos, m.seq, m.hash, p_ipad, p_opad), inline
            mac = encode(sha256(p_opad || sha256(p_ipad || convert_to(
                CASE WHEN l_chain = 0 THEN 'ledger-head:' || m.seq || ':' || m.hash
                     ELSE 'ledger-head:' || l_chain || ':' || m.pos || ':' || m.seq || ':'
                          || m.hash
                END, 'UTF8'))), 'hex')
        FROM m
        WHERE hd.id = l_chain
        RETURNING m.hash INTO l_hash;
        IF l_hash IS NOT NULL THEN
            RETURN l_hash;
        END IF;
        IF l_genesis THEN
            RAISE EXCEPTION 'ledger: the signed head of chain %% is missing', l_chain;
        END IF;
        PERFORM ledger_genesis(p_ipad, p_opad);
        l_genesis := true;
    END LOOP;
END;
$$;
""" % {"lock": APPEND_LOCK_KEY, "chains": GRANT_CHAINS}

# 0009's ledger_append_row: the last definition of its FUNCTIONS (the sequence and the other
# functions before it are left as they are).
PREVIOUS_APPEND_FUNCTION = _0009.FUNCTIONS[
    _0009.FUNCTIONS.index("CREATE OR REPLACE FUNCTION ledger_append_row(") :
]


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0009_grant_chains'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='ledgerentry',
            name='ledger_kind_valid',
        ),
        migrations.RemoveConstraint(
            model_name='ledgerentry',
            name='ledger_chain_valid',
        ),
        migrations.AddConstraint(
            model_name='ledgerentry',
            constraint=models.CheckConstraint(condition=switchboard.constraints.CheckSQL("{0}::text = ANY ('{{policy.create,policy.update,policy.delete,queue.pause,queue.resume,admission.waiver,limits.waiver,limits.set,limits.delete,limits.quarantine,limits.queue,limits.grant,limits.end,endpoint.vend,endpoint.update,endpoint.revoke,endpoint.hook_secret_rotate,token.create,token.revoke,todo.retry,todo.discard}}'::text[])", 'kind'), name='ledger_kind_valid'),
        ),
        migrations.AddConstraint(
            model_name='ledgerentry',
            constraint=models.CheckConstraint(condition=switchboard.constraints.CheckSQL("{0} = 0 OR ({0} <= 8 AND {1}::text = ANY ('{{limits.grant,limits.end}}'::text[]))", 'chain', 'kind'), name='ledger_chain_valid'),
        ),
        migrations.RunSQL(APPEND_FUNCTION, PREVIOUS_APPEND_FUNCTION),
    ]
