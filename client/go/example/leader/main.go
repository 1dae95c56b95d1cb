// Command leader elects a leader among its copies with the redlockd Go
// client: each campaigns for the lock leader:example with its address as
// the holder's value, and prints who leads whenever that changes. Run
// scripts/run first (a daemon on 127.0.0.1:7390), then two copies, each
// with its own address: go run ./example/leader 10.0.0.7:8080
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	redlockd "github.com/redlockd/redlockd/client/go"
)

const election = "leader:example"

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: leader ADDRESS (what the others should know of the leader)")
	}
	me := os.Args[1]
	// Ctrl-C or SIGTERM: step down, and let another copy lead.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := redlockd.Dial(ctx, redlockd.Config{Name: "leader-example"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Observe: who leads now, and after each change (any copy, any daemon).
	w, err := c.Watch(ctx, election)
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		for ev := range w.C() {
			if ev.Held == 0 {
				fmt.Println("leader: none")
			} else {
				fmt.Printf("leader: %s (fence %d)\n", ev.Value, ev.Fence)
			}
		}
	}()

	// Campaign: wait for the lock, with this copy's address as its value;
	// lead while it is held.
	for ctx.Err() == nil {
		lease, err := c.Lock(ctx, election, redlockd.Value(me),
			redlockd.Wait(time.Hour), redlockd.TTL(10*time.Second))
		if errors.Is(err, redlockd.ErrTimeout) || ctx.Err() != nil {
			continue
		} else if err != nil {
			log.Fatal(err)
		}
		fmt.Println("leading as", me)
		select {
		case <-lease.Done(): // lost (the daemon says so): campaign again
			fmt.Println("lost the lead:", lease.Err())
		case <-ctx.Done():
			if err := lease.Unlock(context.Background()); err != nil {
				log.Print(err)
			}
			fmt.Println("stepped down")
		}
	}
}
