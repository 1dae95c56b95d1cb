// Command example takes a lock with the redlockd Go client and works
// under it. Run scripts/run first (a daemon on 127.0.0.1:7390).
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	redlockd "github.com/redlockd/redlockd/client/go"
)

func main() {
	ctx := context.Background()
	c, err := redlockd.Dial(ctx, redlockd.Config{
		Servers: []string{"127.0.0.1:7390"}, // list more daemons for failover
		Name:    "example",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Lock, work while the lease holds, unlock.
	lease, err := c.Lock(ctx, "job:42", redlockd.TTL(10*time.Second), redlockd.Wait(5*time.Second))
	if errors.Is(err, redlockd.ErrTimeout) {
		log.Fatal("job:42 is someone else's: ", err)
	} else if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("got %s, fence %d\n", lease.Resource(), lease.Fence())
	work := lease.Context(ctx) // cancelled if the lease is lost
	select {
	case <-time.After(500 * time.Millisecond): // the work
		fmt.Println("job:42 done")
	case <-work.Done():
		log.Fatal("lost job:42 before the work was done: ", lease.Err())
	}
	if err := lease.Unlock(ctx); err != nil {
		log.Fatal(err)
	}

	// The same in one call: lock, run, unlock.
	err = c.Do(ctx, "job:43", func(ctx context.Context) error {
		fmt.Println("job:43 done")
		return nil
	}, redlockd.Wait(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}

	st, err := c.Status(ctx, "job:42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("job:42 held now:", st.Held)
}
