// redlockd/redlock against node-redlock v5's documented examples (its
// README: Configuration, Usage, Error Handling), with the daemon's address
// where the README passes ioredis clients.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import Redlock, { ExecutionError, Lock, ResourceLockedError } from '../dist/esm/redlock.js';
import { Client, RedlockdError } from '../dist/esm/index.js';
import { Harness } from './harness.mjs';

const h = new Harness();
let daemon;
const redlocks = [];

function make(settings) {
  const r = new Redlock([daemon.server], settings);
  redlocks.push(r);
  return r;
}

// Node 18's runner runs top-level hooks after the suites: every hook and
// suite is inside this one.
describe('redlockd/redlock', () => {
  before(async () => {
    ({ daemon } = await h.cluster(3, { auth: { admin_password: 'opsecret' } }));
  });

  after(async () => {
    for (const r of redlocks) await r.quit();
    await h.cleanup();
  });

  const something = () => sleep(10);
  const somethingElse = () => sleep(10);

  describe("node-redlock's README", () => {
    it('Configuration', () => {
      const redlock = make({
        // The expected clock drift; for more details see:
        // http://redis.io/topics/distlock
        driftFactor: 0.01, // multiplied by lock ttl to determine drift time
        // The max number of times Redlock will attempt to lock a resource
        // before erroring.
        retryCount: 10,
        // the time in ms between attempts
        retryDelay: 200, // time in ms
        // the max time in ms randomly added to retries
        // to improve performance under high contention
        // see https://www.awsarchitectureblog.com/2015/03/backoff.html
        retryJitter: 200, // time in ms
        // The minimum remaining time on a lock before an extension is automatically
        // attempted with the `using` API.
        automaticExtensionThreshold: 500, // time in ms
      });
      assert.equal(redlock.settings.retryCount, 10);
      assert.equal(redlock.settings.retryJitter, 200);
      assert.equal(redlock.clients.size, 1);
      // The defaults are node-redlock's.
      assert.deepEqual(make().settings, {
        driftFactor: 0.01,
        retryCount: 10,
        retryDelay: 200,
        retryJitter: 100,
        automaticExtensionThreshold: 500,
      });
    });

    it('Usage: using', async () => {
      const redlock = make();
      const senderId = 'account:1';
      const recipientId = 'account:2';
      let ran = false;
      await redlock.using([senderId, recipientId], 5000, async (signal) => {
        // Do something...
        await something();

        // Make sure any attempted lock extension has not failed.
        if (signal.aborted) {
          throw signal.error;
        }

        // Do something else...
        await somethingElse();
        ran = true;
      });
      assert.ok(ran);
      // With settings, and the routine's value.
      const v = await redlock.using([senderId], 5000, { retryCount: 5 }, async (signal) => {
        assert.equal(signal.aborted, false);
        return 'value';
      });
      assert.equal(v, 'value');
      const st = await redlock.client.status(senderId);
      assert.equal(st.held, false, 'released after using');
    });

    it('Usage: acquire, extend, release', async () => {
      const redlock = make();
      // Acquire a lock.
      let lock = await redlock.acquire(['a'], 5000);
      assert.ok(lock instanceof Lock);
      assert.deepEqual(lock.resources, ['a']);
      assert.match(lock.value, /^[0-9a-f]{32}$/);
      assert.ok(lock.expiration > Date.now() + 4000 && lock.expiration <= Date.now() + 5000);
      const first = lock;
      try {
        // Do something...
        await something();

        // Extend the lock.
        lock = await lock.extend(5000);

        // Do something else...
        await somethingElse();
      } finally {
        // Release the lock.
        await lock.release();
      }
      assert.notEqual(lock, first);
      assert.equal(first.expiration, 0, 'an extension replaces the lock');
      assert.equal(lock.expiration, 0, 'released');
      assert.equal(lock.value, first.value);
      await assert.rejects(first.extend(1000), (e) => e instanceof ExecutionError && /already-expired/.test(e.message));
    });

    it('Error Handling: ResourceLockedError events, ExecutionError', async () => {
      const redlock = make({ retryCount: 0 });
      const errors = [];
      redlock.on('error', (error) => {
        // Ignore cases where a resource is explicitly marked as locked on a client.
        if (error instanceof ResourceLockedError) {
          errors.push('locked');
          return;
        }
        // Log all other errors.
        errors.push(error);
      });
      const holder = make();
      const lock = await holder.acquire(['busy'], 5000);
      await assert.rejects(redlock.acquire(['busy'], 5000), (e) => {
        assert.ok(e instanceof ExecutionError);
        assert.ok(e.cause instanceof RedlockdError);
        assert.equal(e.cause.code, 'BUSY');
        assert.equal(e.attempts.length, 1);
        return true;
      });
      assert.deepEqual(errors, ['locked']);
      const [stats] = await Promise.all(lock.attempts);
      assert.equal(stats.membershipSize, 3);
      assert.equal(stats.quorumSize, 2);
      await lock.release();
    });

    it('CommonJS: const { default: Redlock } = require(...)', async () => {
      const require = createRequire(import.meta.url);
      const { default: CjsRedlock, ResourceLockedError: CjsLocked } = require('../dist/cjs/redlock.js');
      assert.equal(typeof CjsRedlock, 'function');
      assert.equal(typeof CjsLocked, 'function');
      const redlock = new CjsRedlock([daemon.server]);
      redlocks.push(redlock);
      assert.equal(await redlock.using(['cjs'], 1000, async () => 'cjs'), 'cjs');
    });
  });

  describe('what differs, and what stays', () => {
    it('retries become waiting: granted as soon as the holder lets go', async () => {
      const a = make();
      const b = make({ retryCount: 10, retryDelay: 200, retryJitter: 100 }); // up to 3 s
      const lock = await a.acquire(['wait:1'], 5000);
      setTimeout(() => lock.release(), 300);
      const t0 = Date.now();
      const got = await b.acquire(['wait:1'], 5000);
      const took = Date.now() - t0;
      assert.ok(took >= 250 && took < 1500, `waited ${took} ms`);
      await got.release();
    });

    it('acquire: the lock runs out after its duration unless extended', async () => {
      const a = make();
      const b = make({ retryCount: 0 });
      await a.acquire(['expire:1'], 300);
      await sleep(450);
      const lock = await b.acquire(['expire:1'], 1000);
      await lock.release();
    });

    it('using: the daemon keeps the lock past its duration; the signal tells a loss', async () => {
      const redlock = make();
      const other = make({ retryCount: 0 });
      await redlock.using(['long:1'], 600, async (signal) => {
        await sleep(1000);
        assert.equal(signal.aborted, false);
        await assert.rejects(other.acquire(['long:1'], 1000), ExecutionError);
      });
      await assert.rejects(
        redlock.using(['long:2'], 2000, async (signal) => {
          const aborted = new Promise((res) => signal.addEventListener('abort', res));
          assert.match(await daemon.request('AUTH opsecret\nFORCEUNLOCK long:2'), /^OK/);
          await aborted;
          assert.ok(signal.error instanceof RedlockdError);
          assert.equal(signal.error.code, 'LOST');
          throw signal.error;
        }),
        (e) => e.code === 'LOST',
      );
    });

    it("checks durations as node-redlock does", async () => {
      const redlock = make();
      await assert.rejects(redlock.acquire(['d'], 1.5), /integer/);
      await assert.rejects(redlock.using(['d'], 500, async () => {}), /automaticExtensionThreshold/);
    });

    it('takes a Client, or a Client\'s options', async () => {
      const c = new Client({ servers: [daemon.server], name: 'shared' });
      const redlock = new Redlock(c);
      await redlock.using(['opts:1'], 1000, async () => {});
      await redlock.quit(); // not its Client: stays open
      assert.equal(c.closed, false);
      await c.close();
      const r2 = new Redlock({ servers: [daemon.server], name: 'own' });
      redlocks.push(r2);
      await r2.using(['opts:2'], 1000, async () => {});
    });
  });
});
