// Command primary-url prints the single-host URL of the primary among the hosts of a multi-host
// PostgreSQL URL (internal/primary): `just migrate` runs dbmate, which reads one host only, against it.
//
//	primary-url 'postgres://owner@db1:5432,db2:5432/notifier?sslmode=verify-full'
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/notifierhq/notifier/internal/primary"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: primary-url DATABASE_URL")
		os.Exit(2)
	}
	url, err := primary.URL(context.Background(), os.Args[1], 10*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "primary-url:", err)
		os.Exit(1)
	}
	fmt.Println(url)
}
