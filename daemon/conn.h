/*
 * conn: the I/O half of a session (the struct is in session.h).
 *
 * Reading: bytes are split into lines at LF and queued on the session
 * (read-ahead up to max_pipeline, then reading stops until the queue
 * drains). Writing: every reply and event is formatted straight into the
 * session's output buffer through the calls below, and handed to the
 * kernel by conn_flush. A client whose unsent output reaches
 * max_output_bytes is not reading its replies and is disconnected.
 *
 * Closing is one decision with one reason: conn_close_after_reply (answer
 * what is queued, flush, then close) or conn_close (now).
 */
#ifndef REDLOCKD_CONN_H
#define REDLOCKD_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <uv.h>

#include "proto.h"

struct conf;
struct session;

/* A client connection or a listener: a TCP or a unix stream. */
union conn_stream {
    uv_handle_t handle;
    uv_stream_t stream;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
};

/* The limits conn applies are read from conf at each use (a reload
 * changes them in place). */
void conn_init(const struct conf *conf);
/* Start reading a freshly accepted stream (its handle already set up). */
void conn_start(struct session *s);

/* ---- replies: each call queues one complete line (or, for the ok_begin /
 * kv / end trio, builds one) ---- */
void conn_ok(struct session *s);                        /* "OK" */
void conn_ok_begin(struct session *s);                  /* "OK" ... */
void conn_kv_str(struct session *s, const char *key, const char *val);
void conn_kv_u64(struct session *s, const char *key, uint64_t val);
void conn_kv_i64(struct session *s, const char *key, int64_t val);
void conn_word(struct session *s, const char *word);
void conn_end(struct session *s);                       /* ... LF */
/* "OK <json>"; takes the reference to j. */
void conn_json(struct session *s, json_t *j);
void conn_pong(struct session *s, const char *word, size_t len);
void conn_help(struct session *s);
void conn_usage(struct session *s, enum proto_cmd cmd);     /* HELP cmd */
/* "ERR CODE msg" (msg NULL: the code's default message). */
void conn_err(struct session *s, enum proto_err code, const char *msg);
void conn_errf(struct session *s, enum proto_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void conn_event_lost(struct session *s, const char *resource, uint64_t fence,
                     const char *reason);
void conn_event_shutdown(struct session *s);

/* Hand queued output to the kernel (a direct write first, libuv for the
 * rest); closes the connection once a close-after-reply is due. */
void conn_flush(struct session *s);
/* Queue lines still waiting in the read buffer (read ahead of the pipeline
 * limit); true if any were queued. */
bool conn_refill(struct session *s);
/* Stop reading when the request queue is full; resume when it drains. */
void conn_update_reading(struct session *s);
/* Read no more; close once the queued requests are answered and the
 * output is written. `died` says whether this counts as a drop (for
 * lock_delay). The first reason given is kept. */
void conn_close_after_reply(struct session *s, const char *why, bool died);
/* The daemon closes this connection on its own (reason: handshake, idle,
 * keepalive, output, auth, shutdown): the client hears one
 * "EVENT CLOSING reason=..." line first, when it can. _announced closes
 * after the replies already due, _now_announced at once. Either counts as
 * a drop (lock_delay applies, except at shutdown). */
void conn_close_announced(struct session *s, const char *reason,
                          const char *why);
void conn_close_now_announced(struct session *s, const char *reason,
                              const char *why);
/* Close now. */
void conn_close(struct session *s, bool died, const char *why);

#endif
