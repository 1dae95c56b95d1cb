// Failover against real processes: a dropped connection (resume on the
// same daemon), a daemon restart and a daemon killed or stopped while
// `using` runs (ADOPT on the restarted daemon or another one), and a
// deadline that passes with no daemon to confirm it.
import assert from 'node:assert/strict';
import { afterEach, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { Client } from '../dist/esm/index.js';
import { Harness, Proxy, waitFor } from './harness.mjs';

let h;
let clients;

function client(servers, options = {}) {
  const c = new Client({ servers, name: 'node-failover', timeout: 3000, ...options });
  c.on('error', () => {}); // failed reconnection rounds: expected here
  clients.push(c);
  return c;
}

async function setup(ndaemons = 1, extra) {
  h = new Harness();
  clients = [];
  const nodes = await h.redis(3);
  const daemons = [];
  for (let i = 0; i < ndaemons; i++) daemons.push(await h.daemon(nodes, extra));
  return { nodes, daemons };
}


/** The next `name` event's arguments (events.once would also reject on
 * the 'error' events of failed reconnection rounds). */
const once = (emitter, name) => new Promise((res) => emitter.once(name, (...args) => res(args)));

/** Another session ("another process") asks for `resource` while the
 * routine runs: it must get it only after the routine released it. */
function contender(c, resource, state) {
  return c.acquire(resource, { wait: 30000 }).then(async (lease) => {
    state.contenderGotIt = Date.now();
    assert.equal(state.inside, false, 'the contender got the lock while the routine ran');
    await lease.release();
  });
}

describe('failover while using runs', () => {
  afterEach(async () => {
    for (const c of clients) await c.close().catch(() => {});
    await h.cleanup();
  });

  it('a dropped connection: resume on the same daemon, requests in flight sent again', async () => {
    const { daemons } = await setup(1);
    const proxy = await new Proxy(daemons[0].port).listen();
    try {
      const c = client([proxy.address]);
      const other = client([daemons[0].server]);
      const state = { inside: false, contenderGotIt: 0 };
      const blocker = await other.acquire('resume:wait');
      const result = await c.using('resume:1', { ttl: 3000 }, async (lease) => {
        state.inside = true;
        const token = lease.token;
        const session = c.session;
        // A LOCK waiting at the daemon when the connection goes.
        const waiting = c.acquire('resume:wait', { wait: 10000 });
        await sleep(50);
        const reconnected = once(c, 'reconnect');
        proxy.cut();
        const [info] = await reconnected;
        assert.equal(info.resumed, true);
        assert.equal(c.session, session);
        assert.equal(lease.token, token, 'the same lease, not adopted');
        assert.equal(lease.signal.aborted, false);
        await blocker.release();
        const got = await waiting;
        await got.release();
        await sleep(100);
        assert.equal(lease.state, 'held');
        state.inside = false;
        return 'ok';
      });
      assert.equal(result, 'ok');
      assert.deepEqual((await c.locks()).locks, []);
    } finally {
      await proxy.close();
    }
  });

  it('a daemon restart (SIGTERM, started again): adopted on the new one, nobody else in between', async () => {
    const { daemons } = await setup(1);
    const d = daemons[0];
    const c = client([d.server]);
    const c2 = client([d.server]);
    const state = { inside: false, contenderGotIt: 0 };
    const events = [];
    c.on('reconnect', (i) => events.push(['reconnect', i.resumed]));
    c.on('failover', (i) => events.push(['failover', i.adopted, i.lost]));
    let pending;
    await c.using('restart:1', { ttl: 6000 }, async (lease) => {
      state.inside = true;
      const fence = lease.fence;
      const token = lease.token;
      pending = contender(c2, 'restart:1', state);
      await sleep(100);
      const failover = once(c, 'failover');
      assert.equal(await d.restart(), 0);
      await failover;
      await waitFor(() => lease.state === 'held', 3000);
      assert.equal(lease.signal.aborted, false, 'the routine was told to stop');
      assert.equal(lease.fence, fence, 'the same lease');
      assert.notEqual(lease.token, token, 'adopted: a new token');
      const st = await c.status('restart:1');
      assert.equal(st.holder.session, c.session);
      await sleep(300);
      assert.equal(state.contenderGotIt, 0);
      state.inside = false;
    });
    await pending;
    assert.ok(state.contenderGotIt > 0);
    assert.deepEqual(events, [['reconnect', false], ['failover', 1, 0]]);
  });

  it('a daemon killed (SIGKILL): adopted on another daemon of the same nodes', async () => {
    const { daemons } = await setup(2);
    const [a, b] = daemons;
    const c = client([a.server, b.server]);
    const c2 = client([b.server]);
    const state = { inside: false, contenderGotIt: 0 };
    let pending;
    const out = await c.using(['kill:1', 'kill:2'], { ttl: 4000 }, async (lease) => {
      state.inside = true;
      const fence = lease.fence;
      pending = contender(c2, 'kill:2', state);
      await sleep(100);
      const failover = once(c, 'failover');
      await a.kill();
      const [info] = await failover;
      assert.equal(info.server, b.server);
      assert.equal(info.adopted, 1);
      assert.equal(c.server, b.server);
      assert.equal(lease.fence, fence);
      assert.equal(lease.signal.aborted, false);
      // Still confirmed over more than one ttl (the LOCKS refreshes).
      await sleep(4500);
      assert.equal(lease.state, 'held');
      assert.equal(state.contenderGotIt, 0);
      state.inside = false;
      return 'done';
    });
    assert.equal(out, 'done');
    await pending;
  });

  it('a stalled daemon (SIGSTOP): the lease moves before its deadline', async () => {
    const { daemons } = await setup(2);
    const [a, b] = daemons;
    const c = client([a.server, b.server]);
    const lease = await c.acquire('stall:1', { ttl: 4000 });
    const fence = lease.fence;
    a.pause();
    try {
      const [info] = await once(c, 'failover');
      assert.equal(info.adopted, 1);
      assert.equal(lease.signal.aborted, false);
      assert.equal(lease.fence, fence);
      assert.equal(c.server, b.server);
    } finally {
      a.resume();
    }
    await lease.release();
    assert.equal((await c.status('stall:1')).held, false);
  });

  it('no daemon before the deadline: the signal aborts, the client comes back', async () => {
    const { daemons } = await setup(1);
    const d = daemons[0];
    const c = client([d.server]);
    const lost = [];
    c.on('lost', (l, e) => lost.push(e.reason));
    const lease = await c.acquire('gone:1', { ttl: 1500 });
    let deadline = lease.deadline;
    await d.kill();
    const t = await new Promise((res) => lease.signal.addEventListener('abort', () => res(Date.now())));
    assert.ok(t <= deadline, `aborted ${t - deadline} ms after the deadline`);
    assert.equal(lease.signal.reason.reason, 'deadline');
    assert.deepEqual(lost, ['deadline']);
    await d.startAgain();
    // The keys run out at their ttl; then anyone may have it.
    const again = await c.acquire('gone:1', { wait: 5000 });
    await again.release();
  });

  it('an ADOPT whose answer is lost: the resumed session has the lease (same fence, new token)', async () => {
    const { daemons } = await setup(2);
    const [a, b] = daemons;
    const proxy = await new Proxy(b.port).listen();
    try {
      const c = client([a.server, proxy.address], { timeout: 2000 });
      const reconnects = [];
      c.on('reconnect', (i) => reconnects.push(i.resumed));
      const lease = await c.acquire('adopt:lost', { ttl: 6000 });
      const fence = lease.fence;
      const token = lease.token;
      // Through the proxy: HELLO's answer, then nothing (the ADOPT's reply
      // is swallowed); the ADOPT itself reaches daemon B.
      proxy.swallowAfter('secret=');
      const failover = once(c, 'failover');
      await a.kill();
      await sleep(300);
      proxy.swallowAfter(null);
      const [info] = await failover;
      assert.equal(info.adopted, 1);
      assert.deepEqual(reconnects, [false, true], 'a new session on B, then the same one resumed');
      assert.equal(lease.state, 'held');
      assert.equal(lease.signal.aborted, false);
      assert.equal(lease.fence, fence);
      assert.notEqual(lease.token, token);
      const st = await c.status('adopt:lost');
      assert.equal(st.holder.session, c.session);
      await lease.release();
      assert.equal((await c.status('adopt:lost')).held, false);
    } finally {
      await proxy.close();
    }
  });

  it('EVENT SHUTDOWN with another server: moves there at once', async () => {
    const { daemons } = await setup(2);
    const [a, b] = daemons;
    const c = client([a.server, b.server]);
    const lease = await c.acquire('shut:1', { ttl: 5000 });
    const failover = once(c, 'failover');
    const stopped = a.stop();
    const [info] = await failover;
    assert.equal(info.server, b.server);
    assert.equal(info.adopted, 1);
    // New locks go to the new daemon meanwhile.
    await (await c.acquire('shut:2')).release();
    assert.equal(await stopped, 0);
    assert.equal(lease.state, 'held');
    await lease.release();
  });
});
