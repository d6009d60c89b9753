"""The Redis side of shared admission (`service.scaleout.admission.RedisAdmission` and its parts are its only users).

- `scripts.py`: `SCRIPTS`, the one table of the Lua scripts that make every decision atomically: a script's name
  to its full source (`prelude.py`, the shared prelude, then the body: `ticket_scripts.py` for the ticket calls,
  `maintenance_scripts.py` for the maintenance pass, drain, overview and usage, `adoption_scripts.py` for
  adoption), each body with its contract. They are Python string constants (not `.lua` files), so they ship with
  the `service` package without package-data settings.
- `records.py`: the records the backend hands out (`SharedTicketView`, `SharedAdmissionEvent`, `CloseRequest`,
  `PauseRequest`,
  statistics) and the decoding of what the scripts and the event stream return.
- `mirror.py`: `ReplicaMirror`, one replica's local view between calls to Redis (pure, no I/O).

Key schema (`P` is the key prefix, default `lingstream:admission:`; every key shares it, so a prefix with a hash
tag such as `{lingstream}:admission:` keeps them in one Redis Cluster slot):

    P seq              string  INCR counter: the FIFO order of tickets (score of `queue` and `live`)
    P epoch            string  a random token set by the first replica that finds it missing: when it changes,
                               Redis lost its data (a restart without persistence) and replicas re-assert
    P queue            zset    queued ticket ids by `seq`: the one global FIFO; position = ZRANK + 1
    P qdl / P hbdl     zset    queued ticket ids by queue deadline / heartbeat deadline (Redis server ms)
    P live             zset    queued and admitted ticket ids by `seq` (list_tickets)
    P t:<id>           hash    the ticket and registry record (fields below); finished ones expire
    P p:<id>           string  the opaque create payload, kept while queued and a short while after admission
    P held:<replica>   hash    ticket id -> worker index: the slots a replica holds (counts are derived, never
                               stored, so they cannot drift from the tickets)
    P replica:<id>     string  liveness, SET with PX = replica TTL by the replica's heartbeat
    P url:<id>         string  the replica's address for the other replicas (`LINGSTREAM_REPLICA_URL`: where they
                               forward its sessions' transport routes), SET with the liveness key, the same TTL
    P replicas         hash    replica id -> "workers|slots per worker|health mask|draining|reserved per worker|
                               generation" (a replica's newest info wins, whatever order its calls land in)
    P watch            string  when continuous watching began (SET NX, PX = replica TTL, refreshed by every
                               maintenance pass): the reaper waits until it is one TTL old, so after a gap in
                               which nobody heartbeated (Redis down or restarted) live replicas re-register first
    P kq:<owner>       set     the owner's queued ticket ids   } an owner's quota counts (`admission.quota`),
    P kr:<owner>       set     the owner's admitted ticket ids } kept by every script that moves a ticket
    P seen             hash    replica id -> Redis ms of its last heartbeat (a reaped replica's sessions are billed
                               up to it)
    P u:<owner>:<ms>   hash    usage in one wall-clock bucket (`service.usage.USAGE_BUCKET_S`, expires after the
                               retention): r running ms, q queued ms, s sessions, c chunks, f frames
    P ub:<owner>       zset    the starts of the owner's usage buckets (what `usage_read` sums from `since` on)
    P ut:<owner>       hash    the owner's all-time usage (the same fields; /metrics)
    P uowners          set     every owner with usage
    P lengths          list    recent session lengths in ms (the Retry-After estimate)
    P orphans          zset    admitted ticket ids by `seq` whose replica was lost (or handed them off) and that
                               wait for an adopter (issue #33, `adoption_scripts.py`): in no `held:<r>`
    P ckpt:h:<id>      string  the session's checkpoint header (`service.scaleout.checkpoints`); the reaper orphans a
    P ckpt:i:<id>      string  lost replica's marked (`ad`) sessions only while it exists; and its image
    P ckpt:c:<id>      hash    its model history, one field per chunk (LingBot-World-Fast's latents)
    P events           stream  every ticket change ("k" = kind, "by" = the deciding replica, the ticket's fields)
                               and close requests ("k" = "close", "id", "replica" = the owner, "mode", "by"),
                               pause requests ("k" = "pause", "id", "replica", "action" = pause | resume, "by")

Ticket hash fields: `id owner state reason origin replica worker seq created admitted ended qdl hbdl v ctok failure
status status_reason body um ad orphaned why handed adopted` (`um`: up to when its running time was counted; `ad`:
the owner marked it adoptable; `orphaned`/`adopted`: when it last lost its replica / was adopted; `why`: why it last
lost it, replica_lost or replica_draining, which its adopter counts its recovery under). Times are Redis server
milliseconds since the epoch (`TIME`), so replicas' clocks never matter. `v` grows by one with every change that
emits an event, which lets readers drop stale or repeated events.
"""

from __future__ import annotations

from service.scaleout.redis_side.scripts import SCRIPTS

__all__ = ["SCRIPTS"]
