package cluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// auditPolicy records the metadata of every read (get, list, watch) when
// it completes, and a watch also when its response starts, so that an
// open watch is seen. Writes are not recorded: a benchmark's thousands of
// writes would slow the server it measures.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["get", "list", "watch"]
  - level: None
`

func writeAuditPolicy(dir string) ([]string, error) {
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return nil, fmt.Errorf("cluster: audit policy: %w", err)
	}
	return []string{"--audit-policy-file=" + policy, "--audit-log-path=" + filepath.Join(dir, "audit.log"),
		"--audit-log-maxsize=0", "--audit-log-mode=blocking"}, nil
}

// AuditEvent is one request as the audit log has it.
type AuditEvent struct {
	Stage      string    `json:"stage"` // ResponseStarted (watches), ResponseComplete, Panic
	RequestURI string    `json:"requestURI"`
	Verb       string    `json:"verb"` // list, watch, get, create, ...
	UserAgent  string    `json:"userAgent"`
	Received   time.Time `json:"requestReceivedTimestamp"`
	ObjectRef  *struct {
		Resource string `json:"resource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int32 `json:"code"`
	} `json:"responseStatus"`
}

// Resource is the resource the request was for ("" for non-resource URLs).
func (e AuditEvent) Resource() string {
	if e.ObjectRef == nil {
		return ""
	}
	return e.ObjectRef.Resource
}

// AuditEvents reads the audit log (Options.Audit) and returns the events
// whose user agent starts with agent, received at or after since, in the
// order they were written.
func (c *Cluster) AuditEvents(agent string, since time.Time) ([]AuditEvent, error) {
	if !c.opts.Audit {
		return nil, fmt.Errorf("cluster: started without Options.Audit")
	}
	f, err := os.Open(filepath.Join(c.Dir, "audit.log"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	var bad error // a line being written as it is read is the last one
	for sc.Scan() {
		if bad != nil {
			return nil, bad
		}
		var e AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			bad = fmt.Errorf("cluster: audit log: %w", err)
			continue
		}
		if strings.HasPrefix(e.UserAgent, agent) && !e.Received.Before(since) {
			out = append(out, e)
		}
	}
	return out, sc.Err()
}

// Read sorts a read of a resource: "list" (a LIST, counted when it
// completes), "list-page" (a LIST's next page, continue=: the same
// list), "watch-list" (a watch with sendInitialEvents: every object
// again, as a list would), "watch" (a watch that starts from a
// resourceVersion or from now), both counted when their response starts;
// "" for anything else and for the other stages.
func (e AuditEvent) Read() string {
	switch {
	case e.Verb == "watch" && e.Stage == "ResponseStarted" && strings.Contains(e.RequestURI, "sendInitialEvents=true"):
		return "watch-list"
	case e.Verb == "watch" && e.Stage == "ResponseStarted":
		return "watch"
	case e.Verb == "list" && e.Stage == "ResponseComplete" && strings.Contains(e.RequestURI, "continue="):
		return "list-page"
	case e.Verb == "list" && e.Stage == "ResponseComplete":
		return "list"
	}
	return ""
}
