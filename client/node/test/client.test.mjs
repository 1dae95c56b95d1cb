// The API against three real redis-server nodes and a real redlockd.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { Client, Lease, RedlockdError } from '../dist/esm/index.js';
import { Harness, waitFor } from './harness.mjs';

const h = new Harness();
let daemon;
let nodes;
const clients = [];

function client(options = {}) {
  const c = new Client({ servers: [daemon.server], name: 'node-test', password: 'clientpw', ...options });
  clients.push(c);
  return c;
}

const code = (want) => (e) => {
  assert.ok(e instanceof RedlockdError, `a RedlockdError, not ${e}`);
  assert.equal(e.code, want, e.message);
  return true;
};

// Node 18's runner runs top-level hooks after the suites: every hook and
// suite is inside this one.
describe('the client against a real daemon', () => {
  before(async () => {
    ({ nodes, daemon } = await h.cluster(3, {
      auth: {
        password: 'clientpw',
        admin_password: 'opsecret',
        users: [
          { name: 'billing', password: 'billpw', prefixes: ['invoice:'] },
        ],
      },
    }));
  });

  after(async () => {
    for (const c of clients) await c.close();
    await h.cleanup();
  });

  describe('acquire and release', () => {
    it('gives a lease with token, fence, deadline and signal', async () => {
      const c = client();
      const t0 = Date.now();
      const lease = await c.acquire('job:1', { ttl: 5000 });
      assert.ok(lease instanceof Lease);
      assert.deepEqual(lease.resources, ['job:1']);
      assert.equal(lease.resource, 'job:1');
      assert.match(lease.token, /^[0-9a-f]{32}$/);
      assert.equal(typeof lease.fence, 'bigint');
      assert.ok(lease.fence > 0n);
      assert.equal(lease.ttl, 5000);
      assert.equal(lease.mode, 'exclusive');
      assert.equal(lease.state, 'held');
      assert.ok(lease.deadline > t0 + 4000 && lease.deadline <= Date.now() + 5000, `deadline ${lease.deadline - t0}`);
      assert.ok(lease.signal instanceof AbortSignal);
      assert.equal(lease.signal.aborted, false);
      lease.check();
      const st = await c.status('job:1');
      assert.equal(st.held, true);
      assert.equal(st.holder.name, 'node-test');
      assert.equal(BigInt(st.holder.fence), lease.fence);
      await lease.release();
      assert.equal(lease.state, 'released');
      assert.equal(lease.signal.aborted, false, 'a release does not abort');
      await lease.release(); // a second call: nothing more
      assert.equal((await c.status('job:1')).held, false);
    });

    it('fences increase from one grant to the next', async () => {
      const c = client();
      const a = await c.acquire('job:fence');
      await a.release();
      const b = await c.acquire('job:fence');
      await b.release();
      assert.ok(b.fence > a.fence);
    });

    it('extends a lease: a new deadline', async () => {
      const c = client();
      const lease = await c.acquire('job:ext', { ttl: 2000 });
      const d0 = lease.deadline;
      assert.equal(await lease.extend(20000), lease);
      assert.equal(lease.ttl, 20000);
      assert.ok(lease.deadline > d0 + 15000);
      const locks = await c.locks();
      assert.equal(locks.locks.find((l) => l.resource === 'job:ext').ttl, 20000);
      await lease.release();
      await assert.rejects(lease.extend(1000), code('NOTHELD'));
    });

    it('locks several resources at once, all or none', async () => {
      const c = client();
      const other = client();
      const held = await other.acquire('multi:b');
      await assert.rejects(c.acquire(['multi:a', 'multi:b', 'multi:c']), code('BUSY'));
      assert.equal((await c.status('multi:a')).held, false, 'none of them taken');
      await held.release();
      const lease = await c.acquire(['multi:a', 'multi:b', 'multi:c'], { ttl: 3000 });
      assert.deepEqual(lease.resources, ['multi:a', 'multi:b', 'multi:c']);
      await lease.extend(6000);
      await lease.release();
      for (const r of lease.resources) assert.equal((await c.status(r)).held, false);
    });

    it('takes shared locks and semaphore slots', async () => {
      const a = client();
      const b = client();
      const r1 = await a.acquire('report', { mode: 'shared' });
      const r2 = await b.acquire('report', { mode: 'shared' });
      assert.equal(r1.mode, 'shared');
      assert.equal((await a.status('report')).shared_holders, 2);
      await assert.rejects(client().acquire('report'), code('BUSY'));
      await r1.release();
      await r2.release();
      const s1 = await a.acquire('encoders', { limit: 2 });
      const s2 = await b.acquire('encoders', { limit: 2 });
      assert.equal(s1.limit, 2);
      assert.deepEqual(new Set([s1.slot, s2.slot]), new Set([0, 1]));
      await assert.rejects(client().acquire('encoders', { limit: 2 }), code('BUSY'));
      await s1.release();
      await s2.release();
    });

    it('renew: false lets the lease run out', async () => {
      const c = client();
      const lease = await c.acquire('job:norenew', { ttl: 400, renew: false });
      assert.equal(lease.renew, false);
      const why = await new Promise((res) => lease.signal.addEventListener('abort', () => res(lease.signal.reason)));
      assert.ok(why instanceof RedlockdError);
      assert.equal(why.code, 'LOST');
      assert.equal(lease.lost, true);
      assert.throws(() => lease.check(), code('LOST'));
      await assert.rejects(lease.release(), code('LOST'));
      // The keys expire a moment after (the drift margin): free for others.
      await (await client().acquire('job:norenew', { wait: 2000 })).release();
    });
  });

  describe('errors', () => {
    it('BUSY, TIMEOUT and the daemon\'s own codes', async () => {
      const holder = client();
      const c = client();
      const lease = await holder.acquire('err:1');
      await assert.rejects(c.acquire('err:1'), code('BUSY'));
      const t0 = Date.now();
      await assert.rejects(c.acquire('err:1', { wait: 300 }), code('TIMEOUT'));
      assert.ok(Date.now() - t0 >= 250);
      await assert.rejects(c.acquire('err:2', { ttl: 1 }), code('ARG')); // below locks.min_ttl_ms
      await assert.rejects(c.acquire('err:2', { limit: 100000 }), code('ARG'));
      await lease.release();
    });

    it('wait: Infinity waits until granted', async () => {
      const holder = client();
      const c = client();
      const lease = await holder.acquire('err:inf');
      setTimeout(() => lease.release(), 300);
      const t0 = Date.now();
      const got = await c.acquire('err:inf', { wait: Infinity });
      assert.ok(Date.now() - t0 >= 250);
      await got.release();
    });

    it('DENIED outside a user\'s prefixes, AUTH for a wrong password', async () => {
      const billing = client({ user: 'billing', password: 'billpw' });
      await (await billing.acquire('invoice:7')).release();
      await assert.rejects(billing.acquire('report:7'), code('DENIED'));
      const wrong = client({ user: 'billing', password: 'nope', timeout: 1000 });
      await assert.rejects(wrong.acquire('invoice:8'), code('AUTH'));
    });

    it('CONNECTION when no daemon answers', async () => {
      const c = client({ servers: ['127.0.0.1:1'], timeout: 300 });
      await assert.rejects(c.acquire('x'), code('CONNECTION'));
      await assert.rejects(c.connect(), code('CONNECTION'));
    });
  });

  describe('using', () => {
    it('runs the routine under the lock and returns its result', async () => {
      const c = client();
      const out = await c.using('use:1', { ttl: 5000 }, async (lease) => {
        assert.equal((await c.status('use:1')).held, true);
        assert.equal(lease.state, 'held');
        return 42;
      });
      assert.equal(out, 42);
      assert.equal((await c.status('use:1')).held, false);
      assert.equal(await c.using(['use:1', 'use:2'], () => 'sync'), 'sync');
    });

    it('releases when the routine throws, and rethrows', async () => {
      const c = client();
      await assert.rejects(
        c.using('use:throw', async () => {
          throw new Error('boom');
        }),
        /boom/,
      );
      assert.equal((await c.status('use:throw')).held, false);
    });

    it('rejects with LOST when the lease was lost under the routine', async () => {
      const c = client();
      await assert.rejects(
        c.using('use:lost', async (lease) => {
          const aborted = new Promise((res) => lease.signal.addEventListener('abort', res));
          assert.match(await daemon.request('AUTH opsecret\nFORCEUNLOCK use:lost'), /^OK/);
          await aborted;
          assert.equal(lease.signal.reason.reason, 'node');
          return 'done';
        }),
        (e) => e.code === 'LOST' && e.reason === 'node',
      );
    });
  });

  describe('one client, many tasks', () => {
    it('queues tasks after the same resource here, first come first served', async () => {
      const c = client();
      const order = [];
      const tasks = [0, 1, 2, 3, 4].map((i) =>
        c.using('fifo:1', { wait: 5000 }, async () => {
          order.push(i);
          await sleep(5);
        }),
      );
      await Promise.all(tasks);
      assert.deepEqual(order, [0, 1, 2, 3, 4]);
    });

    it('a task that does not wait gets BUSY, never HELD', async () => {
      const c = client();
      const lease = await c.acquire('local:busy');
      await assert.rejects(c.acquire('local:busy'), code('BUSY'));
      await assert.rejects(c.acquire('local:busy', { wait: 100 }), code('TIMEOUT'));
      const later = c.acquire('local:busy', { wait: 5000 });
      await sleep(50);
      await lease.release();
      await (await later).release();
    });

    it('500 concurrent using calls over 50 resources: one holder at a time', async () => {
      const c = client();
      const inside = new Map();
      let max = 0;
      let done = 0;
      const t0 = Date.now();
      await Promise.all(
        Array.from({ length: 500 }, (_, i) => {
          const r = `many:${i % 50}`;
          return c.using(r, { wait: 30000, ttl: 10000 }, async (lease) => {
            const n = (inside.get(r) ?? 0) + 1;
            inside.set(r, n);
            max = Math.max(max, n);
            await sleep(1 + (i % 3));
            lease.check();
            inside.set(r, inside.get(r) - 1);
            done++;
          });
        }),
      );
      assert.equal(done, 500);
      assert.equal(max, 1, 'two holders of one resource at once');
      assert.deepEqual((await c.locks()).locks, []);
      console.log(`# 500 using calls over 50 resources: ${Date.now() - t0} ms`);
    });

    it('the same resource from two clients (two sessions): one at a time', async () => {
      const a = client();
      const b = client();
      let inside = 0;
      let max = 0;
      await Promise.all(
        Array.from({ length: 40 }, (_, i) =>
          (i % 2 ? a : b).using('two:1', { wait: 10000 }, async () => {
            inside++;
            max = Math.max(max, inside);
            await sleep(1);
            inside--;
          }),
        ),
      );
      assert.equal(max, 1);
    });
  });

  describe('cancelling a waiting acquire', () => {
    it('while it waits behind another task of this client', async () => {
      const c = client();
      const lease = await c.acquire('cancel:1');
      const ac = new AbortController();
      const p = c.acquire('cancel:1', { wait: 10000, signal: ac.signal });
      const next = c.acquire('cancel:1', { wait: 10000 });
      await sleep(20);
      ac.abort(new Error('no longer needed'));
      await assert.rejects(p, /no longer needed/);
      await lease.release();
      await (await next).release();
    });

    it('while the daemon has it waiting (held by another session)', async () => {
      const holder = client();
      const c = client();
      const lease = await holder.acquire('cancel:2');
      const ac = new AbortController();
      const t0 = Date.now();
      const p = c.acquire('cancel:2', { wait: 10000, signal: ac.signal });
      setTimeout(() => ac.abort(), 100);
      await assert.rejects(p, (e) => e.name === 'AbortError');
      assert.ok(Date.now() - t0 < 1000);
      await lease.release();
      // The grant that came meanwhile was given back: the next one gets it.
      const again = await c.acquire('cancel:2', { wait: 2000 });
      await again.release();
      const other = await holder.acquire('cancel:2', { wait: 2000 });
      await other.release();
      assert.deepEqual((await c.locks()).locks, []);
    });
  });

  describe('the rest of the API', () => {
    it('ping, locks, sessions, stats, serverInfo', async () => {
      const c = client();
      assert.equal(await c.ping(), '');
      assert.equal(await c.ping('hi'), 'hi');
      const lease = await c.acquire('api:1');
      const locks = await c.locks();
      assert.equal(locks.session, c.session);
      assert.equal(locks.locks[0].resource, 'api:1');
      assert.ok((await c.sessions()).sessions.length >= 1);
      assert.ok('uptime_s' in (await c.stats()) || Object.keys(await c.stats()).length > 0);
      assert.equal(c.serverInfo.nodes, 3);
      assert.equal(c.serverInfo.quorum, 2);
      assert.equal(c.connected, true);
      await lease.release();
    });

    it('the unix socket', async () => {
      const c = client({ servers: [daemon.unixServer] });
      await (await c.acquire('unix:1')).release();
    });

    it('close() releases what is held and refuses more', async () => {
      const c = new Client({ servers: [daemon.server], password: 'clientpw' });
      const lease = await c.acquire('close:1');
      const closing = [];
      c.on('close', () => closing.push('close'));
      await c.close();
      assert.equal(lease.state, 'lost');
      assert.equal(lease.signal.reason.reason, 'closed');
      assert.deepEqual(closing, ['close']);
      // QUIT is answered, then the daemon releases the session's locks.
    const other = client();
    assert.ok(await waitFor(async () => !(await other.status('close:1')).held, 2000));
      await assert.rejects(c.acquire('close:2'), code('CONNECTION'));
      await c.close();
    });

    it('a stopped node set: the lease is lost before its deadline', async () => {
      const c = client();
      const lease = await c.acquire('loss:1', { ttl: 1500 });
      let lastDeadline = lease.deadline;
      const tick = setInterval(() => {
        if (!lease.signal.aborted) lastDeadline = lease.deadline;
      }, 5);
      for (const n of nodes) n.pause();
      try {
        const t = await new Promise((res) => lease.signal.addEventListener('abort', () => res(Date.now())));
        assert.ok(t <= lastDeadline, `aborted ${t - lastDeadline} ms after the deadline`);
        assert.equal(lease.signal.reason.code, 'LOST');
      } finally {
        clearInterval(tick);
        for (const n of nodes) n.resume();
      }
      await assert.rejects(lease.release(), code('LOST'));
    });
  });
});
