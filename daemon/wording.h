/*
 * wording: the sentences clients read when lockmgr refuses a request.
 *
 * lockmgr decides and hands up a reason with its facts (struct
 * lockmgr_refusal); this is where the session layer turns that into the
 * protocol's error code and the message after it, so that the words
 * people read have one home and the decision layer knows no protocol.
 * Pure: unit-tested with lockmgr's own tests.
 */
#ifndef REDLOCKD_WORDING_H
#define REDLOCKD_WORDING_H

#include <stddef.h>

#include "lockmgr.h"
#include "proto.h"

/* The code for the refusal of a request of command cmd (LOCK, ADOPT,
 * UNLOCK, EXTEND, FORCEUNLOCK), and its sentence in msg (size bytes,
 * truncated if need be). */
enum proto_err wording_refusal(enum proto_cmd cmd,
                               const struct lockmgr_refusal *no, char *msg,
                               size_t size);

#endif
