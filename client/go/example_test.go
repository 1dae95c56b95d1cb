package redlockd_test

// Examples, run by go test against the tests' own daemon ($REDLOCKD_SERVER
// points at it; without Servers, Dial uses it).

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	redlockd "github.com/redlockd/redlockd/client/go"
)

func Example() {
	ctx := context.Background()
	c, err := redlockd.Dial(ctx, redlockd.Config{Name: "example"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	err = c.Do(ctx, "example:report", func(ctx context.Context) error {
		// ctx is cancelled if the lock is lost: stop writing then.
		fmt.Println("writing the report")
		return nil
	}, redlockd.TTL(10*time.Second), redlockd.Wait(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	// Output: writing the report
}

func ExampleClient_Lock() {
	ctx := context.Background()
	c, err := redlockd.Dial(ctx, redlockd.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	lease, err := c.Lock(ctx, "example:invoice:1001", redlockd.TTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	// Give the fence to storage that refuses writes with an older one.
	fmt.Println(lease.Resource(), lease.Fence() > 0)
	if err := lease.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: example:invoice:1001 true
}

func ExampleClient_Lock_busy() {
	ctx := context.Background()
	a, _ := redlockd.Dial(ctx, redlockd.Config{})
	defer a.Close()
	b, _ := redlockd.Dial(ctx, redlockd.Config{})
	defer b.Close()

	lease, _ := a.Lock(ctx, "example:busy")
	_, err := b.Lock(ctx, "example:busy")
	fmt.Println(errors.Is(err, redlockd.ErrBusy))
	_, err = b.Lock(ctx, "example:busy", redlockd.Wait(100*time.Millisecond))
	fmt.Println(errors.Is(err, redlockd.ErrTimeout))
	lease.Unlock(ctx)
	// Output:
	// true
	// true
}

func ExampleClient_Lock_several() {
	ctx := context.Background()
	c, _ := redlockd.Dial(ctx, redlockd.Config{})
	defer c.Close()

	// All or none; one lease, one fence.
	lease, err := c.Lock(ctx, "example:account:17", redlockd.Also("example:account:42"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(lease.Resources())
	lease.Unlock(ctx)
	// Output: [example:account:17 example:account:42]
}

func ExampleLease_Done() {
	ctx := context.Background()
	c, _ := redlockd.Dial(ctx, redlockd.Config{})
	defer c.Close()

	// Without renewal the lease ends at its ttl.
	lease, _ := c.Lock(ctx, "example:short", redlockd.TTL(200*time.Millisecond), redlockd.NoRenew())
	<-lease.Done()
	fmt.Println(errors.Is(lease.Err(), redlockd.ErrLost))
	// Output: true
}

func ExampleClient_Locker() {
	ctx := context.Background()
	c, _ := redlockd.Dial(ctx, redlockd.Config{})
	defer c.Close()

	m := c.Locker("example:counter") // a sync.Locker
	m.Lock()
	fmt.Println("in the critical section")
	m.Unlock()
	// Output: in the critical section
}

func ExampleClient_Watch() {
	ctx := context.Background()
	observer, _ := redlockd.Dial(ctx, redlockd.Config{})
	defer observer.Close()
	candidate, _ := redlockd.Dial(ctx, redlockd.Config{Name: "db-1"})
	defer candidate.Close()

	w, err := observer.Watch(ctx, "example:leader")
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()
	fmt.Println("held:", (<-w.C()).Held) // first, the state now

	// A leader publishes its address with its lock, and may change it.
	lease, _ := candidate.Lock(ctx, "example:leader", redlockd.Value("10.0.0.7:5432"))
	ev := <-w.C()
	fmt.Println("held:", ev.Held, ev.Name, ev.Value, ev.Fence == lease.Fence())
	lease.SetValue(ctx, "10.0.0.8:5432")
	fmt.Println("value:", (<-w.C()).Value)
	lease.Unlock(ctx)
	fmt.Println("held:", (<-w.C()).Held)
	// Output:
	// held: 0
	// held: 1 db-1 10.0.0.7:5432 true
	// value: 10.0.0.8:5432
	// held: 0
}

func ExampleLease_SetValue() {
	ctx := context.Background()
	c, _ := redlockd.Dial(ctx, redlockd.Config{})
	defer c.Close()

	lease, err := c.Lock(ctx, "example:primary", redlockd.Value("10.0.0.7:5432"))
	if err != nil {
		log.Fatal(err)
	}
	// Still the holder, with the same fence: a new address for the others.
	if err := lease.SetValue(ctx, "10.0.0.8:5432"); err != nil {
		log.Fatal(err)
	}
	st, _ := c.Status(ctx, "example:primary")
	fmt.Println(lease.Value(), st.Holder.Value, st.Holder.Fence == lease.Fence())
	lease.Unlock(ctx)
	// Output: 10.0.0.8:5432 10.0.0.8:5432 true
}
