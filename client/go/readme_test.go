package redlockd

import (
	"os"
	"strings"
	"testing"
)

// The programs README.md prints are the files they name, byte for byte
// (go vet and the build check the files).
func TestReadmePrograms(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"example/main.go", "example/leader/main.go"} {
		marker := "<!-- go-example: " + path + " -->\n```go\n"
		s := string(readme)
		i := strings.Index(s, marker)
		if i < 0 {
			t.Fatalf("README.md: no go-example block of %s", path)
		}
		s = s[i+len(marker):]
		block := s[:strings.Index(s, "```\n")]
		file, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if block != string(file) {
			t.Fatalf("README.md's program differs from %s", path)
		}
	}
}
