module github.com/redlockd/redlockd/client/go

go 1.19
