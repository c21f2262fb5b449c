// Command argodb runs Argo Workflows v4's own database code (persist/sqldb)
// against a real PostgreSQL or MySQL, so rewind's archive module is tested
// against Argo's real tables and bytes. See ../NOTES.md.
//
// Input: one JSON request per line; output: one JSON answer per line, same order.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"

	"github.com/upper/db/v4"

	"github.com/argoproj/argo-workflows/v4/config"
	persistsqldb "github.com/argoproj/argo-workflows/v4/persist/sqldb"
	wfv1 "github.com/argoproj/argo-workflows/v4/pkg/apis/workflow/v1alpha1"
	"github.com/argoproj/argo-workflows/v4/util/instanceid"
	"github.com/argoproj/argo-workflows/v4/util/logging"
	"github.com/argoproj/argo-workflows/v4/util/sqldb"
)

type request struct {
	// migrate | archive | getArchived | save | get | marshal
	Op string `json:"op"`
	// Argo's own persistence config (the `persistence` block's DB part).
	DB          config.DBConfig `json:"db"`
	User        string          `json:"user"`
	Password    string          `json:"password"`
	ClusterName string          `json:"clusterName"`
	InstanceID  string          `json:"instanceID"`
	TableName   string          `json:"tableName"`
	Workflow    *wfv1.Workflow  `json:"workflow"`
	UID         string          `json:"uid"`
	Namespace   string          `json:"namespace"`
	Nodes       wfv1.Nodes      `json:"nodes"`
	Version     string          `json:"version"`
}

type answer struct {
	Version string `json:"version,omitempty"`
	// Go's json.Marshal of the nodes (save, get, marshal) or of the workflow
	// (getArchived), as a string so the caller sees Go's exact bytes.
	JSON  string  `json:"json,omitempty"`
	Error *string `json:"error"`
}

// Sessions stay open across requests, one per database config.
var sessions = map[string]*sqldb.SessionProxy{}

func main() {
	// upper/db logs slow queries to stdout, which carries the answers.
	db.LC().SetLogger(log.New(os.Stderr, "", log.LstdFlags))
	ctx := logging.WithLogger(context.Background(),
		logging.NewSlogLoggerCustom(logging.Error, logging.Text, os.Stderr))
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<30)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var res answer
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			res.Error = errText(fmt.Errorf("decode request: %w", err))
		} else if res2, err := run(ctx, req); err != nil {
			res.Error = errText(err)
		} else {
			res = res2
		}
		if err := out.Encode(res); err != nil {
			fmt.Fprintln(os.Stderr, "argodb: write answer:", err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "argodb: read requests:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, req request) (answer, error) {
	if req.Op == "marshal" {
		b, err := json.Marshal(req.Nodes)
		return answer{JSON: string(b)}, err
	}
	proxy, err := session(req)
	if err != nil {
		return answer{}, err
	}
	clusterName := req.ClusterName
	if clusterName == "" {
		clusterName = "default"
	}
	switch req.Op {
	case "migrate":
		return answer{}, persistsqldb.Migrate(ctx, proxy.Session(), clusterName, req.TableName, proxy.DBType())
	case "archive":
		archive := persistsqldb.NewWorkflowArchive(proxy, clusterName, "", instanceid.NewService(req.InstanceID))
		return answer{}, archive.ArchiveWorkflow(ctx, req.Workflow)
	case "getArchived":
		archive := persistsqldb.NewWorkflowArchive(proxy, clusterName, "", instanceid.NewService(req.InstanceID))
		wf, err := archive.GetWorkflow(ctx, req.UID, "", "")
		if err != nil || wf == nil {
			return answer{}, err
		}
		b, err := json.Marshal(wf)
		return answer{JSON: string(b)}, err
	case "save", "get":
		repo, err := persistsqldb.NewOffloadNodeStatusRepo(ctx, logging.RequireLoggerFromContext(ctx), proxy, clusterName, req.TableName)
		if err != nil {
			return answer{}, err
		}
		if req.Op == "save" {
			version, err := repo.Save(ctx, req.UID, req.Namespace, req.Nodes)
			return answer{Version: version}, err
		}
		nodes, err := repo.Get(ctx, req.UID, req.Version)
		if err != nil {
			return answer{}, err
		}
		b, err := json.Marshal(nodes)
		return answer{JSON: string(b)}, err
	}
	return answer{}, fmt.Errorf("unknown op %q (want migrate, archive, getArchived, save, get or marshal)", req.Op)
}

// session opens (once) a session the way Argo's controller does, from the
// persistence config and the credentials its Secrets hold.
func session(req request) (*sqldb.SessionProxy, error) {
	key, err := json.Marshal([]any{req.DB, req.User, req.Password})
	if err != nil {
		return nil, err
	}
	if p, ok := sessions[string(key)]; ok {
		return p, nil
	}
	var sess db.Session
	sess, _, err = sqldb.CreateDBSessionWithCreds(req.DB, req.User, req.Password)
	if err != nil {
		return nil, fmt.Errorf("open database session: %w", err)
	}
	p := sqldb.NewSessionProxyFromSession(sess, &req.DB, req.User, req.Password)
	sessions[string(key)] = p
	return p, nil
}

func errText(err error) *string {
	s := err.Error()
	return &s
}
