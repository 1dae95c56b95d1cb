package redlockd

import (
	"os"
	"strings"
	"testing"
)

// The program README.md prints is example/main.go, byte for byte (go vet
// and the build check the file).
func TestReadmeProgram(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	const marker = "<!-- go-example: example/main.go -->\n```go\n"
	s := string(readme)
	i := strings.Index(s, marker)
	if i < 0 {
		t.Fatal("README.md: no go-example block")
	}
	s = s[i+len(marker):]
	block := s[:strings.Index(s, "```\n")]
	file, err := os.ReadFile("example/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if block != string(file) {
		t.Fatal("README.md's program differs from example/main.go")
	}
}
