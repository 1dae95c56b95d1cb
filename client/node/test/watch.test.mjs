// Holder values and watches (docs/protocol.md, "Watching a lock", "Holder
// values") against three real redis-server nodes and real daemons on them:
// a value set, replaced and read through another daemon; a watch that sees
// the first state and every change made through another daemon (values,
// shared holders, semaphores, a foreign SET NX key and its expiry); a slow
// consumer that gets the latest state; UNWATCH for what no other watch
// wants; LIMIT and DENIED; a leader election; and watches that go on
// through a dropped connection (resume) and a daemon killed (failover).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, afterEach, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { inspect } from 'node:util';

import { Client, RedlockdError, Watch } from '../dist/esm/index.js';
import { Harness, Proxy, ask, waitFor } from './harness.mjs';

const code = (want) => (e) => {
  assert.ok(e instanceof RedlockdError, `a RedlockdError, not ${e}`);
  assert.equal(e.code, want, e.message);
  return true;
};

/** Events of `w` until one satisfies `pred` (within ms); those read. */
async function until(w, pred, ms = 3000) {
  const seen = [];
  const end = Date.now() + ms;
  for (;;) {
    let timer;
    const r = await Promise.race([
      w.next(),
      new Promise((res) => {
        timer = setTimeout(() => res(null), Math.max(0, end - Date.now()));
      }),
    ]);
    clearTimeout(timer);
    if (r === null) assert.fail(`no such event within ${ms} ms; saw ${inspect(seen)}`);
    if (r.done) assert.fail(`the watch ended; saw ${inspect(seen)}`);
    seen.push(r.value);
    if (pred(r.value)) return seen;
  }
}

/** The next event of w, or null when none comes within ms (the next()
 * left waiting takes the one after: use it last). */
async function nextWithin(w, ms) {
  let timer;
  const r = await Promise.race([
    w.next(),
    new Promise((res) => {
      timer = setTimeout(() => res(null), ms);
    }),
  ]);
  clearTimeout(timer);
  return r;
}

const LONG = { timeout: 60000 };

// Node 18's runner runs top-level hooks after the suites: every hook and
// suite is inside this one.
describe('values and watches against two daemons', () => {
  const h = new Harness();
  let nodes;
  let d1;
  let d2;
  let d3;
  const clients = [];

  function client(daemon, options = {}) {
    const c = new Client({ servers: [daemon.server], name: 'node-watch', ...options });
    clients.push(c);
    return c;
  }

  before(async () => {
    nodes = await h.redis(3);
    d1 = await h.daemon(nodes, { id: 'd1', locks: { watch_poll_ms: 200 } });
    d2 = await h.daemon(nodes, { id: 'd2', locks: { watch_poll_ms: 200 } });
    // A third, with a small watch limit and a user held to its prefixes.
    d3 = await h.daemon(nodes, {
      id: 'd3',
      limits: { max_watches: 2 },
      auth: { password: 'clientpw', users: [{ name: 'carol', password: 'carolpw', prefixes: ['job:'] }] },
    });
  });

  after(async () => {
    for (const c of clients) await c.close();
    await h.cleanup();
  });

  describe('holder values', () => {
    it('set by acquire, replaced by setValue and extend, read through another daemon', async () => {
      const a = client(d1, { name: 'alice' });
      const b = client(d2);
      const lease = await a.acquire('val:1', { ttl: 20000, value: 'http://10.0.0.7:8080/a?b=c' });
      assert.equal(lease.value, 'http://10.0.0.7:8080/a?b=c');
      let st = await b.status('val:1');
      assert.equal(st.holder.value, 'http://10.0.0.7:8080/a?b=c');
      assert.equal(st.holder.name, 'alice');
      assert.equal(st.holder.daemon, 'd1');
      assert.equal(BigInt(st.holder.fence), lease.fence);
      const locks = await a.locks();
      assert.equal(locks.locks.find((l) => l.resource === 'val:1').value, 'http://10.0.0.7:8080/a?b=c');

      // Replaced in place: the same token and fence, the ttl as it was, a
      // new deadline.
      const { token, fence } = lease;
      const d0 = lease.deadline;
      await sleep(50);
      assert.equal(await lease.setValue('v2'), lease);
      assert.equal(lease.value, 'v2');
      assert.equal(lease.ttl, 20000);
      assert.equal(lease.token, token);
      assert.equal(lease.fence, fence);
      assert.ok(lease.deadline > d0, 'setValue confirms the lease as extend does');
      assert.equal((await b.status('val:1')).holder.value, 'v2');
      assert.equal((await a.status('val:1')).holder.value, 'v2');
      assert.equal((await a.locks()).locks.find((l) => l.resource === 'val:1').ttl, 20000);

      // extend with a value: both at once.
      await lease.extend(8000, { value: 'v3' });
      assert.equal(lease.ttl, 8000);
      assert.equal(lease.value, 'v3');
      st = await b.status('val:1');
      assert.equal(st.holder.value, 'v3');
      assert.ok(st.nodes.every((n) => n.pttl <= 8000), inspect(st.nodes));
      await lease.release();
      assert.equal((await b.status('val:1')).holder, null);
      await assert.rejects(lease.setValue('v4'), code('NOTHELD'));
    });

    it('in using, on several resources, and kept by nothing else', async () => {
      const a = client(d1);
      const b = client(d2);
      await a.using(['val:m1', 'val:m2'], { value: 'both' }, async (lease) => {
        assert.equal(lease.value, 'both');
        assert.equal((await b.status('val:m1')).holder.value, 'both');
        assert.equal((await b.status('val:m2')).holder.value, 'both');
        await lease.setValue('both2');
        assert.equal((await b.status('val:m2')).holder.value, 'both2');
      });
      // A lease without a value has none.
      const plain = await a.acquire('val:m1');
      assert.equal(plain.value, undefined);
      assert.equal((await b.status('val:m1')).holder.value, undefined);
      await plain.release();
    });

    it('refuses values that are not for exclusive locks, or not words', async () => {
      const a = client(d1);
      for (const bad of ['', 'a b', 'é', 5, 'x'.repeat(4097)]) {
        await assert.rejects(a.acquire('val:bad', { value: bad }), TypeError, String(bad));
      }
      await assert.rejects(a.acquire('val:bad', { mode: 'shared', value: 'x' }), TypeError);
      await assert.rejects(a.acquire('val:bad', { limit: 2, value: 'x' }), TypeError);
      // Longer than the daemon's locks.max_value_len (256): its ARG.
      await assert.rejects(a.acquire('val:bad', { value: 'x'.repeat(257) }), code('ARG'));
      const shared = await a.acquire('val:sh', { mode: 'shared' });
      await assert.rejects(shared.setValue('x'), TypeError);
      await shared.release();
      const slot = await a.acquire('val:sem', { limit: 2 });
      await assert.rejects(slot.extend(5000, { value: 'x' }), TypeError);
      await slot.release();
      const lease = await a.acquire('val:bad', { value: 'ok' });
      await assert.rejects(lease.setValue('a b'), TypeError);
      await assert.rejects(lease.extend(undefined), TypeError);
      assert.equal(lease.value, 'ok');
      await lease.release();
      assert.deepEqual((await a.locks()).locks, []);
    });
  });

  describe('watch', () => {
    it('the first state, then each change through the other daemon, values included', async () => {
      const w = client(d1, { name: 'watcher' });
      const b = client(d2, { name: 'bob' });
      const watch = w.watch('w:1');
      assert.ok(watch instanceof Watch);
      assert.deepEqual(watch.resources, ['w:1']);
      let [ev] = await until(watch, () => true);
      await watch.ready;
      assert.deepEqual({ ...ev }, {
        resource: 'w:1',
        held: 0,
        mode: undefined,
        fence: undefined,
        name: undefined,
        daemon: undefined,
        value: undefined,
        foreign: false,
        limit: undefined,
      });

      const lease = await b.acquire('w:1', { value: '10.0.0.9:80' });
      ev = (await until(watch, (e) => e.held === 1)).pop();
      assert.equal(ev.mode, 'exclusive');
      assert.equal(ev.fence, lease.fence);
      assert.equal(typeof ev.fence, 'bigint');
      assert.equal(ev.name, 'bob');
      assert.equal(ev.daemon, 'd2');
      assert.equal(ev.value, '10.0.0.9:80');
      assert.equal(ev.foreign, false);

      await lease.setValue('10.0.0.9:81');
      ev = (await until(watch, () => true)).pop();
      assert.equal(ev.value, '10.0.0.9:81');
      assert.equal(ev.fence, lease.fence);

      await lease.release();
      ev = (await until(watch, () => true)).pop();
      assert.equal(ev.held, 0);

      // A holder through this daemon, with no name and no value.
      const c = client(d1, { name: undefined });
      const l2 = await c.acquire('w:1');
      ev = (await until(watch, (e) => e.held === 1)).pop();
      assert.equal(ev.name, '');
      assert.equal(ev.daemon, 'd1');
      assert.equal(ev.value, undefined);
      assert.ok(ev.fence > lease.fence);
      await l2.release();
      await until(watch, (e) => e.held === 0);
      await watch.return();
    });

    it('shared holders, semaphore slots, several resources, a foreign key and its expiry', LONG, async () => {
      const w = client(d1);
      const b = client(d2);
      const c = client(d2);
      const watch = w.watch(['sh:1', 'sem:1', 'f:1']);
      await watch.ready;
      const r1 = await b.acquire('sh:1', { mode: 'shared' });
      const r2 = await c.acquire('sh:1', { mode: 'shared' });
      let ev = (await until(watch, (e) => e.resource === 'sh:1' && e.held === 2)).pop();
      assert.equal(ev.mode, 'shared');
      assert.equal(ev.fence, undefined);
      await r1.release();
      await r2.release();
      await until(watch, (e) => e.resource === 'sh:1' && e.held === 0);

      const s1 = await b.acquire('sem:1', { limit: 3 });
      ev = (await until(watch, (e) => e.resource === 'sem:1' && e.held === 1)).pop();
      assert.equal(ev.mode, 'semaphore');
      assert.equal(ev.limit, 3);
      await s1.release();
      await until(watch, (e) => e.resource === 'sem:1' && e.held === 0);

      // A plain Redlock client's key on every node, then its expiry.
      for (const n of nodes) assert.match(await ask(n.port, 'SET lock:f:1 0123456789abcdef NX PX 1200\r\n', 500), /^\+OK/);
      ev = (await until(watch, (e) => e.resource === 'f:1' && e.held === 1)).pop();
      assert.equal(ev.foreign, true);
      assert.equal(ev.mode, undefined);
      assert.equal(ev.value, undefined);
      await until(watch, (e) => e.resource === 'f:1' && e.held === 0, 4000);
      await watch.return();
    });

    it('a slow consumer gets the latest state of each resource, never an older one last', LONG, async () => {
      const w = client(d1);
      const b = client(d2);
      const watch = w.watch('slow:1', 'slow:2');
      const told = [];
      w.on('holder', (ev) => told.push(ev));
      await watch.ready;
      for (let i = 0; i < 30; i++) {
        const l = await b.acquire(['slow:1', 'slow:2'], { value: `v${i}` });
        await l.release();
      }
      const last = await b.acquire('slow:1', { value: 'final' });
      assert.ok(await waitFor(() => told.some((e) => e.value === 'final'), 3000), 'the client heard the final state');
      await sleep(300); // and whatever comes after it
      // Not read until now: one event per resource, the latest.
      const got = [(await watch.next()).value, (await watch.next()).value];
      const byRes = Object.fromEntries(got.map((e) => [e.resource, e]));
      assert.equal(byRes['slow:1'].value, 'final');
      assert.equal(byRes['slow:1'].fence, last.fence);
      assert.equal(byRes['slow:2'].held, 0);
      assert.equal(await nextWithin(watch, 200), null, 'nothing older after them');
      assert.ok(told.length > 3, `the 'holder' event told ${told.length}`);
      await last.release();
      await watch.return();
    });

    it('a burst through both daemons: fences never go back, the last state is the final one', LONG, async () => {
      const w = client(d1);
      const b = client(d1);
      const c = client(d2);
      const watch = w.watch('burst:1');
      await watch.ready;
      const seen = [];
      const reader = (async () => {
        for await (const ev of watch) {
          seen.push(ev);
          await sleep(seen.length % 7 === 0 ? 20 : 0); // a consumer slower at times
        }
      })();
      await Promise.all(
        [b, c].map(async (x) => {
          for (let i = 0; i < 100; i++) await (await x.acquire('burst:1', { wait: 5000, value: `n${i}` })).release();
        }),
      );
      await sleep(500);
      await watch.return();
      await reader;
      let fence = 0n;
      for (const ev of seen.filter((e) => e.held === 1)) {
        assert.ok(ev.fence >= fence, `fence ${ev.fence} after ${fence}`);
        fence = ev.fence;
      }
      assert.ok(seen.length >= 2 && fence > 0n, `${seen.length} events`);
      assert.equal(seen[seen.length - 1].held, 0);
    });

    it('break ends it; a second watch of a resource gets its state; UNWATCH only for what nobody else watches', async () => {
      // d3 lets a session watch two resources at most.
      const w = client(d3, { password: 'clientpw' });
      const b = client(d3, { password: 'clientpw' });
      const first = w.watch('u:1');
      for await (const ev of first) {
        assert.equal(ev.held, 0);
        break;
      }
      assert.deepEqual(await first.next(), { value: undefined, done: true });
      const w1 = w.watch('u:1');
      const w3 = w.watch('u:2');
      await until(w1, () => true);
      await until(w3, () => true);
      // A second watch of u:1: its state at once, from what the client
      // knows (no second WATCH).
      const w2 = w.watch('u:1');
      const now = await nextWithin(w2, 20);
      assert.equal(now?.value?.held, 0);
      await Promise.all([w1.ready, w2.ready, w3.ready]);
      // A third resource is beyond the daemon's limit.
      const over = w.watch('u:3');
      await assert.rejects(over.ready, code('LIMIT'));
      await assert.rejects(over.next(), code('LIMIT'));
      assert.deepEqual(await over.next(), { value: undefined, done: true });
      // w1 ends: u:1 is still w2's (no UNWATCH), which hears its changes.
      await w1.return();
      const lease = await b.acquire('u:1', { value: 'still' });
      assert.equal((await until(w2, () => true)).pop().value, 'still');
      await lease.release();
      await until(w2, (e) => e.held === 0);
      assert.deepEqual(await w1.next(), { value: undefined, done: true });
      // w2 ends too: UNWATCH u:1, so u:3 fits now.
      await w2.close();
      const u3 = w.watch('u:3');
      await u3.ready;
      assert.equal((await until(u3, () => true)).pop().held, 0);
      await u3.return();
      await w3.return();
    });

    it('a user watches within its prefixes only: DENIED, all or none', async () => {
      const carol = client(d3, { user: 'carol', password: 'carolpw' });
      const denied = carol.watch('job:1', 'invoice:1');
      await assert.rejects(denied.next(), code('DENIED'));
      await assert.rejects(denied.ready, code('DENIED'));
      const ok = carol.watch('job:1');
      assert.equal((await until(ok, () => true)).pop().resource, 'job:1');
      await ok.return();
    });

    it('a signal stops it: the iterator rejects with its reason', async () => {
      const w = client(d1);
      const ac = new AbortController();
      const watch = w.watch('sig:1', { signal: ac.signal });
      const seen = [];
      const loop = (async () => {
        for await (const ev of watch) seen.push(ev);
      })();
      await waitFor(() => seen.length === 1, 3000);
      ac.abort();
      await assert.rejects(loop, (e) => e.name === 'AbortError');
      assert.deepEqual(await watch.next(), { value: undefined, done: true });
      // Aborted already: ends at once, nothing sent.
      const again = w.watch('sig:1', { signal: ac.signal });
      await assert.rejects(again.next(), (e) => e.name === 'AbortError');
    });

    it('close() of the client ends its watches quietly', async () => {
      const w = new Client({ servers: [d1.server] });
      const watch = w.watch('close:1');
      await until(watch, () => true);
      const pending = watch.next();
      await w.close();
      assert.deepEqual(await pending, { value: undefined, done: true });
      const late = w.watch('close:1');
      await assert.rejects(late.next(), code('CONNECTION'));
    });
  });

  describe('leader election', () => {
    it('two candidates campaign; the leader steps down, the other leads, a watcher sees the new value', LONG, async () => {
      const observer = client(d1, { name: 'observer' });
      const watch = observer.watch('leader:db');
      await until(watch, (e) => e.held === 0);
      const leaders = [];
      const stepDown = {};
      const campaign = (daemon, name, address) => {
        const c = client(daemon, { name });
        return c.using('leader:db', { wait: Infinity, value: address }, async (lease) => {
          leaders.push({ name, fence: lease.fence });
          await new Promise((res) => {
            stepDown[name] = res;
          });
          return name;
        });
      };
      const one = campaign(d1, 'db-1', '10.0.0.7:5432');
      let ev = (await until(watch, (e) => e.held === 1)).pop();
      assert.equal(ev.value, '10.0.0.7:5432');
      assert.equal(ev.name, 'db-1');
      const two = campaign(d2, 'db-2', '10.0.0.8:5432');
      await sleep(200);
      assert.deepEqual(leaders.map((l) => l.name), ['db-1'], 'one leader at a time');

      stepDown['db-1']();
      assert.equal(await one, 'db-1');
      ev = (await until(watch, (e) => e.held === 1 && e.value === '10.0.0.8:5432')).pop();
      assert.equal(ev.name, 'db-2');
      assert.equal(ev.daemon, 'd2');
      assert.deepEqual(leaders.map((l) => l.name), ['db-1', 'db-2']);
      assert.ok(leaders[1].fence > leaders[0].fence);
      assert.equal(ev.fence, leaders[1].fence);

      stepDown['db-2']();
      assert.equal(await two, 'db-2');
      await until(watch, (e) => e.held === 0);
      await watch.return();
    });

    it('the leader process killed: the other candidate leads once its session\'s detach time ran out', LONG, async () => {
      const observer = client(d2, { name: 'observer' });
      const watch = observer.watch('leader:kill');
      await until(watch, (e) => e.held === 0);
      // The first leader in a process of its own, with detach: 1000.
      const index = new URL('../dist/esm/index.js', import.meta.url).href;
      const code = `
        import { Client } from ${JSON.stringify(index)};
        const c = new Client({ servers: [${JSON.stringify(d1.server)}], name: 'proc-1', detach: 1000 });
        await c.using('leader:kill', { wait: Infinity, value: 'proc-1:80' }, async () => {
          console.log('leading');
          await new Promise(() => {});
        });`;
      const child = spawn(process.execPath, ['--input-type=module', '-e', code], { stdio: ['ignore', 'pipe', 'inherit'] });
      try {
        let out = '';
        child.stdout.setEncoding('utf8');
        child.stdout.on('data', (d) => {
          out += d;
        });
        assert.ok(await waitFor(() => out.includes('leading'), 5000), 'the child never led');
        let ev = (await until(watch, (e) => e.held === 1)).pop();
        assert.equal(ev.value, 'proc-1:80');
        const second = client(d2, { name: 'proc-2' });
        const two = second.acquire('leader:kill', { wait: Infinity, value: 'proc-2:80' });
        await sleep(200);
        const t0 = Date.now();
        child.kill('SIGKILL');
        const lease = await two;
        const took = Date.now() - t0;
        assert.ok(took >= 800 && took < 5000, `the lead moved after ${took} ms`);
        console.log(`# the leader killed: the lead moved after ${took} ms (detach: 1000)`);
        ev = (await until(watch, (e) => e.held === 1 && e.value === 'proc-2:80')).pop();
        assert.equal(ev.name, 'proc-2');
        assert.equal(ev.fence, lease.fence);
        await lease.release();
      } finally {
        child.kill('SIGKILL');
      }
      await watch.return();
    });
  });
});

describe('watches through failures', () => {
  let h;
  let clients;

  function client(servers, options = {}) {
    const c = new Client({ servers, name: 'node-watch-fo', timeout: 3000, ...options });
    c.on('error', () => {}); // failed reconnection rounds: expected here
    clients.push(c);
    return c;
  }

  async function setup(n, extra = {}) {
    h = new Harness();
    clients = [];
    const nodes = await h.redis(3);
    const daemons = [];
    for (let i = 0; i < n; i++) daemons.push(await h.daemon(nodes, { id: `fo${i}`, ...extra }));
    return daemons;
  }

  afterEach(async () => {
    for (const c of clients) await c.close().catch(() => {});
    await h.cleanup();
  });

  it('a dropped connection: the resumed session tells the state again, changes go on', LONG, async () => {
    // A session watches two resources at most here.
    const [d] = await setup(1, { limits: { max_watches: 2 } });
    const proxy = await new Proxy(d.port).listen();
    try {
      const w = client([proxy.address]);
      const b = client([d.server], { name: 'holder' });
      const watch = w.watch('res:1');
      const gone = w.watch('res:gone');
      await until(watch, (e) => e.held === 0);
      await until(gone, (e) => e.held === 0);
      const session = w.session;
      const reconnected = new Promise((res) => w.once('reconnect', res));
      proxy.blocked = true;
      proxy.cut();
      assert.ok(await waitFor(() => !w.connected, 2000));
      // Given up while away: UNWATCH once the session is back.
      await gone.return();
      // Changed while the watcher is away.
      const lease = await b.acquire('res:1', { value: 'while-away' });
      proxy.blocked = false;
      const info = await reconnected;
      assert.equal(info.resumed, true);
      assert.equal(w.session, session);
      const ev = (await until(watch, (e) => e.held === 1)).pop();
      assert.equal(ev.value, 'while-away');
      await lease.setValue('after');
      assert.equal((await until(watch, () => true)).pop().value, 'after');
      // res:gone was unwatched: a second resource fits again.
      const fresh = w.watch('res:new');
      await fresh.ready;
      await until(fresh, (e) => e.held === 0);
      await lease.release();
      await until(watch, (e) => e.held === 0);
    } finally {
      await proxy.close();
    }
  });

  it('a daemon killed: a new session on the other daemon is sent WATCH again; the holder\'s lease and value move too', LONG, async () => {
    const [a, b] = await setup(2);
    const w = client([a.server, b.server]);
    const holder = client([a.server, b.server], { name: 'holder' });
    const lease = await holder.acquire('fo:1', { ttl: 5000, value: 'v1' });
    const watch = w.watch('fo:1', 'fo:2');
    let ev = (await until(watch, (e) => e.resource === 'fo:1' && e.held === 1)).pop();
    assert.equal(ev.value, 'v1');
    assert.equal(ev.daemon, 'fo0');
    const session = w.session;
    const movedW = new Promise((res) => w.once('failover', res));
    const movedH = new Promise((res) => holder.once('failover', res));
    await a.kill();
    const [infoW, infoH] = await Promise.all([movedW, movedH]);
    assert.equal(infoW.server, b.server);
    assert.equal(infoH.adopted, 1);
    assert.notEqual(w.session, session);
    assert.equal(lease.value, 'v1');
    // The state through the new daemon (the ADOPT keeps the value).
    ev = (await until(watch, (e) => e.resource === 'fo:1' && e.daemon === 'fo1')).pop();
    assert.equal(ev.value, 'v1');
    assert.equal(ev.fence, lease.fence);
    await lease.setValue('v2');
    ev = (await until(watch, (e) => e.resource === 'fo:1' && e.value === 'v2')).pop();
    assert.equal(ev.name, 'holder');
    // The other resource is watched on the new session as well.
    const other = await client([b.server]).acquire('fo:2', { value: 'x' });
    assert.equal((await until(watch, (e) => e.resource === 'fo:2' && e.held === 1)).pop().value, 'x');
    await other.release();
    await lease.release();
    await until(watch, (e) => e.resource === 'fo:1' && e.held === 0);
    await watch.return();
  });
});
