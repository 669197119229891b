package cotx_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// daemon is a real cotx-coordinator process for the tests, configured the way
// harness/cotest/daemon.py does it: a TOML file, a free loopback port, a random token.
type daemon struct {
	dir, url, token, conf string
	cmd                   *exec.Cmd
}

func daemonBinary() (string, error) {
	cache := os.Getenv("COTX_CACHE")
	if cache == "" {
		cache = "/var/cache/cotx"
	}
	cands := []string{os.Getenv("COTX_COORDINATOR_BIN"), filepath.Join(cache, "bin", "cotx-coordinator"),
		filepath.Join(cache, "target-coord", "release", "cotx-coordinator")}
	for _, c := range cands {
		if c == "" {
			continue
		}
		if st, err := os.Stat(c); err == nil && st.Mode()&0o111 != 0 {
			return c, nil
		}
	}
	return "", fmt.Errorf("cotx-coordinator not built: run scripts/build.sh (or set COTX_COORDINATOR_BIN)")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// resource is one [[resources]] entry; enforcement "" leaves the daemon's default (auto).
type resource struct{ name, kind, dsn, enforcement string }

func startDaemon(resources []resource) (*daemon, error) {
	return startDaemonAs(resources, "g1", 2000)
}

// startDaemonAs: node id node (another daemon's branches on the same servers are left
// alone by each), owner grace period ownerGraceMs.
func startDaemonAs(resources []resource, node string, ownerGraceMs int) (*daemon, error) {
	return startDaemonConf(resources, node, ownerGraceMs, "")
}

// startDaemonConf: startDaemonAs with more of the config's tables (TOML, e.g.
// "[limits]\nmax_active = 1\n").
func startDaemonConf(resources []resource, node string, ownerGraceMs int, extra string) (*daemon, error) {
	return startDaemonRecovering(resources, node, ownerGraceMs, 500, extra)
}

// startDaemonRecovering: startDaemonConf with a recovery pass every recoveryMs (each pass
// queues a store write: tests that count the store's syncs make it rare).
func startDaemonRecovering(resources []resource, node string, ownerGraceMs, recoveryMs int, extra string) (*daemon, error) {
	bin, err := daemonBinary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "cotx-go-coord-")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	d := &daemon{dir: dir, url: fmt.Sprintf("http://127.0.0.1:%d", port), token: hex.EncodeToString(tok)}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "node_id = %q\nlisten = \"127.0.0.1:%d\"\ntoken = %q\n\n[timeouts]\n", node, port, d.token)
	fmt.Fprintf(&cfg, "transaction_ms = 30000\nowner_grace_ms = %d\n", ownerGraceMs)
	fmt.Fprintf(&cfg, "recovery_interval_ms = %d\n", recoveryMs)
	cfg.WriteString("retry_initial_ms = 50\nretry_max_ms = 500\nretention_ms = 60000\n")
	fmt.Fprintf(&cfg, "\n[store]\nkind = \"sqlite\"\npath = %q\n\n%s", filepath.Join(dir, "decisions.db"), extra)
	for _, r := range resources {
		fmt.Fprintf(&cfg, "\n[[resources]]\nname = %q\nkind = %q\ndsn = %q\npool_size = 2\n", r.name, r.kind, r.dsn)
		if r.enforcement != "" {
			fmt.Fprintf(&cfg, "enforcement = %q\n", r.enforcement)
		}
	}
	conf := filepath.Join(dir, "coordinator.toml")
	if err := os.WriteFile(conf, []byte(cfg.String()), 0o600); err != nil {
		return nil, err
	}
	d.conf = conf
	if err := d.launch(bin); err != nil {
		return nil, err
	}
	return d, nil
}

// launch starts the daemon's process on its config and waits until it answers.
func (d *daemon) launch(bin string) error {
	logf, err := os.OpenFile(filepath.Join(d.dir, "coordinator.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	d.cmd = exec.Command(bin, "serve", "--config", d.conf)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := d.cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- d.cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("coordinator exited (%v): see %s/coordinator.log", err, d.dir)
		default:
		}
		if resp, err := http.Get(d.url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				go func() { <-exited }()
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.stop()
	return fmt.Errorf("coordinator did not answer on %s", d.url)
}

// restart kills the daemon (-9: no shutdown of its own) and starts it again on the same
// config, store and port: a new epoch, which knows none of the old one's leased ranges.
func (d *daemon) restart() error {
	bin, err := daemonBinary()
	if err != nil {
		return err
	}
	_ = d.cmd.Process.Kill()
	for i := 0; i < 100 && d.cmd.Process.Signal(syscall.Signal(0)) == nil; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	return d.launch(bin)
}

// modes: each resource's enforcement mode as the daemon reports it (GET /v1/resources):
// engine, client, none, or unknown / refused.
func (d *daemon) modes() (map[string]string, error) {
	req, _ := http.NewRequest("GET", d.url+"/v1/resources", nil)
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Resources []struct {
			Name        string `json:"name"`
			Enforcement struct {
				Mode   string `json:"mode"`
				Reason string `json:"reason"`
			} `json:"enforcement"`
		} `json:"resources"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("GET /v1/resources (%s): %v", resp.Status, err)
	}
	m := map[string]string{}
	for _, x := range r.Resources {
		m[x.Name] = x.Enforcement.Mode
		if x.Enforcement.Reason != "" {
			m[x.Name] += " (" + x.Enforcement.Reason + ")"
		}
	}
	return m, nil
}

func (d *daemon) stop() {
	if d.cmd != nil && d.cmd.Process != nil {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() {
			for i := 0; i < 100; i++ {
				if d.cmd.Process.Signal(syscall.Signal(0)) != nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			close(done)
		}()
		<-done
		_ = d.cmd.Process.Kill()
	}
	if os.Getenv("COTX_KEEP_SERVERS") == "" {
		_ = os.RemoveAll(d.dir)
	}
}
