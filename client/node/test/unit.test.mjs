// The pure parts: addresses, reply fields, errors, arguments refused
// before anything is sent. No daemon.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { Client, RedlockdError } from '../dist/esm/index.js';
import { fields, parseServer, serverList } from '../dist/esm/proto.js';
import { replyError } from '../dist/esm/errors.js';

describe('addresses', () => {
  it('reads the grammar of the other clients', () => {
    assert.deepEqual(parseServer('127.0.0.1:7391'), { kind: 'tcp', host: '127.0.0.1', port: 7391, text: '127.0.0.1:7391' });
    assert.deepEqual(parseServer('tcp://db.example:7400'), { kind: 'tcp', host: 'db.example', port: 7400, text: 'tcp://db.example:7400' });
    assert.deepEqual(parseServer('tls://b.example:7391'), { kind: 'tls', host: 'b.example', port: 7391, text: 'tls://b.example:7391' });
    assert.deepEqual(parseServer('lockhost'), { kind: 'tcp', host: 'lockhost', port: 7390, text: 'lockhost' });
    assert.deepEqual(parseServer('[::1]:7000'), { kind: 'tcp', host: '::1', port: 7000, text: '[::1]:7000' });
    assert.deepEqual(parseServer('unix:/run/redlockd/redlockd.sock'), {
      kind: 'unix',
      path: '/run/redlockd/redlockd.sock',
      text: 'unix:/run/redlockd/redlockd.sock',
    });
    assert.equal(parseServer('unix:///run/x.sock').path, '/run/x.sock');
    assert.equal(parseServer('/run/x.sock').path, '/run/x.sock');
  });

  it('refuses what is not an address', () => {
    for (const bad of ['', 'http://x:1', 'h:0', 'h:65536', 'h:12a', '[::1', '[1.2.3.4]:5', 'unix:rel', 'a b:1']) {
      assert.throws(() => parseServer(bad), TypeError, bad);
    }
  });

  it('takes a list, a comma list, or $REDLOCKD_SERVER', () => {
    assert.deepEqual(
      serverList(['a:1', 'b:2,c:3'], undefined).map((a) => a.text),
      ['a:1', 'b:2', 'c:3'],
    );
    assert.deepEqual(serverList(undefined, 'x:1, y:2').map((a) => a.text), ['x:1', 'y:2']);
    assert.deepEqual(serverList(undefined, undefined).map((a) => a.text), ['127.0.0.1:7390']);
  });
});

describe('replies', () => {
  it('splits OK words at their first =', () => {
    assert.deepEqual(fields('resource=a token=00ff fence=7 ttl=30000 validity=29900 x=a=b'), {
      resource: 'a',
      token: '00ff',
      fence: '7',
      ttl: '30000',
      validity: '29900',
      x: 'a=b',
    });
    assert.deepEqual(fields(''), {});
  });

  it('makes RedlockdErrors of ERR lines', () => {
    const e = replyError('ERR BUSY job:1 is held by someone else', 'job:1');
    assert.ok(e instanceof RedlockdError);
    assert.ok(e instanceof Error);
    assert.equal(e.name, 'RedlockdError');
    assert.equal(e.code, 'BUSY');
    assert.equal(e.message, 'job:1 is held by someone else');
    assert.equal(e.resource, 'job:1');
    assert.equal(replyError('ERR LOST x').reason, 'lost');
  });
});

describe('arguments', () => {
  it('checks the options of a Client', () => {
    assert.throws(() => new Client({ servers: [] }), TypeError);
    assert.throws(() => new Client({ servers: ['x:1'], name: 'two words' }), TypeError);
    assert.throws(() => new Client({ servers: ['x:1'], password: 'a b' }), TypeError);
    assert.throws(() => new Client({ servers: ['x:1'], user: 'u' }), /needs a password/);
    assert.throws(() => new Client({ servers: ['x:1'], timeout: -1 }), TypeError);
    assert.throws(() => new Client({ servers: ['x:1'], detach: 1.5 }), TypeError);
  });

  it('refuses bad resources and options before sending', async () => {
    // A server nobody listens on: nothing is sent for these anyway.
    const c = new Client({ servers: ['127.0.0.1:1'], timeout: 200 });
    try {
      await assert.rejects(c.acquire(''), TypeError);
      await assert.rejects(c.acquire('a b'), TypeError);
      await assert.rejects(c.acquire('a=b'), TypeError);
      await assert.rejects(c.acquire([]), TypeError);
      await assert.rejects(c.acquire(['a', 'a']), TypeError);
      await assert.rejects(c.acquire('a', { ttl: 0 }), TypeError);
      await assert.rejects(c.acquire('a', { wait: -1 }), TypeError);
      await assert.rejects(c.acquire('a', { mode: 'read' }), TypeError);
      await assert.rejects(c.acquire('a', { signal: {} }), TypeError);
      await assert.rejects(c.using('a'), TypeError);
      const ac = new AbortController();
      ac.abort(new Error('already'));
      await assert.rejects(c.acquire('a', { signal: ac.signal }), /already/);
      // Nothing listens there: CONNECTION after the timeout.
      await assert.rejects(c.acquire('a'), (e) => e instanceof RedlockdError && e.code === 'CONNECTION');
    } finally {
      await c.close();
    }
    await assert.rejects(c.acquire('a'), (e) => e.code === 'CONNECTION');
  });

  it('refuses bad values and watches before sending', async () => {
    const c = new Client({ servers: ['127.0.0.1:1'], timeout: 200 });
    try {
      for (const bad of ['', 'a b', 'tab\there', 'é', 7, null, 'x'.repeat(4097)]) {
        await assert.rejects(c.acquire('a', { value: bad }), TypeError, String(bad));
      }
      await assert.rejects(c.acquire('a', { value: 'x', mode: 'shared' }), TypeError);
      await assert.rejects(c.acquire('a', { value: 'x', limit: 3 }), TypeError);
      assert.throws(() => c.watch(), TypeError);
      assert.throws(() => c.watch(''), TypeError);
      assert.throws(() => c.watch('a b'), TypeError);
      assert.throws(() => c.watch('a', 'a'), TypeError);
      assert.throws(() => c.watch([]), TypeError);
      assert.throws(() => c.watch('a', { signal: {} }), TypeError);
      assert.throws(() => c.watch({}), TypeError);
      // The forms it takes: names, an array, options last.
      const ac = new AbortController();
      for (const w of [c.watch('a', 'b'), c.watch(['a', 'b']), c.watch(['a', 'b'], { signal: ac.signal }), c.watch('a', 'b', {})]) {
        assert.deepEqual(w.resources, ['a', 'b']);
        assert.equal(w[Symbol.asyncIterator](), w);
        await w.return();
        assert.deepEqual(await w.next(), { value: undefined, done: true });
      }
    } finally {
      await c.close();
    }
  });
});

describe('holder events', () => {
  it('reads EVENT HOLDER words', async () => {
    const { holderEvent } = await import('../dist/esm/watch.js');
    assert.deepEqual(
      { ...holderEvent(fields('resource=leader:db held=1 mode=exclusive fence=41 name=db-2 daemon=web-1 value=http://10.0.0.8:5432/?a=b')) },
      { resource: 'leader:db', held: 1, mode: 'exclusive', fence: 41n, name: 'db-2', daemon: 'web-1', value: 'http://10.0.0.8:5432/?a=b', foreign: false, limit: undefined },
    );
    const free = holderEvent(fields('resource=x held=0'));
    assert.equal(free.held, 0);
    assert.equal(free.mode, undefined);
    assert.ok(Object.isFrozen(free));
    assert.equal(holderEvent(fields('resource=x held=1 mode=exclusive fence=2 name= daemon=d')).name, '');
    assert.equal(holderEvent(fields('resource=x held=1 foreign=1')).foreign, true);
    const sem = holderEvent(fields('resource=x held=2 mode=semaphore limit=3'));
    assert.equal(sem.mode, 'semaphore');
    assert.equal(sem.limit, 3);
    assert.equal(holderEvent(fields('held=1')), null);
  });
});
