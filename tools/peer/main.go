// Command peer runs Argo Workflows v4's own retry, in process, against a
// cluster: the Argo Server's RetryWorkflow (server/workflow/workflow_server.go)
// and RetryArchivedWorkflow (server/workflowarchive/archived_workflow_server.go)
// called directly, with the caller's clients in the context as the server's
// gatekeeper puts them there. It is the yardstick rewind is compared with, in
// the end-to-end tests and the benchmarks.
//
//	peer retry --kubeconfig K --namespace N (--name W | --selector L) [--qps 20 --burst 30]
//	           [--configmap NS/NAME] [--node-field-selector S]
//	           [--parameter name=value]... [--restart-successful]
//	peer retry-archived --kubeconfig K --namespace N --uid UID --configmap NS/NAME [...]
//
// --qps/--burst 20/30 is the Argo Server's default budget, 5/10 is `argo retry`
// without a server (client-go's defaults). --configmap names Argo's
// workflow-controller-configmap: its instanceID, and its persistence block
// (Secrets read from its namespace) for the archive and offloaded nodes, as
// the Argo Server builds them at start (server/apiserver/argoserver.go). The
// hydrator reads ALWAYS_OFFLOAD_NODE_STATUS from the environment, as Argo's
// does. --selector retries every workflow of the namespace whose labels match, as
// `argo retry -l L` does through an Argo Server (cmd/argo/commands/retry.go): the
// server's ListWorkflows, then its RetryWorkflow once per workflow, one after
// another, stopping at the first error; each call with clients of its own, as
// the server's gatekeeper gives every call in its default auth mode (client,
// server/auth/gatekeeper.go), so each call a fresh budget of --qps/--burst (in
// server auth mode one set of clients would serve them all). On success it prints one JSON
// line: {"workflow": NAME, "seconds": ELAPSED} (with --selector, "workflow" says
// how many were retried).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/argoproj/argo-workflows/v4/config"
	"github.com/argoproj/argo-workflows/v4/persist/sqldb"
	workflowpkg "github.com/argoproj/argo-workflows/v4/pkg/apiclient/workflow"
	workflowarchivepkg "github.com/argoproj/argo-workflows/v4/pkg/apiclient/workflowarchive"
	"github.com/argoproj/argo-workflows/v4/pkg/client/clientset/versioned"
	"github.com/argoproj/argo-workflows/v4/server/auth"
	"github.com/argoproj/argo-workflows/v4/server/workflow"
	"github.com/argoproj/argo-workflows/v4/server/workflow/store"
	"github.com/argoproj/argo-workflows/v4/server/workflowarchive"
	"github.com/argoproj/argo-workflows/v4/util/instanceid"
	"github.com/argoproj/argo-workflows/v4/util/logging"
	utilsqldb "github.com/argoproj/argo-workflows/v4/util/sqldb"
)

type parameters []string

func (p *parameters) String() string     { return strings.Join(*p, ",") }
func (p *parameters) Set(v string) error { *p = append(*p, v); return nil }

const usage = "usage: peer retry --kubeconfig K --namespace N (--name W | --selector L) [flags]\n" +
	"       peer retry-archived --kubeconfig K --namespace N --uid UID --configmap NS/NAME [flags]"

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "retry" && os.Args[1] != "retry-archived") {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	archived := os.Args[1] == "retry-archived"
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the caller")
	namespace := fs.String("namespace", "", "the workflow's namespace")
	name := fs.String("name", "", "the workflow's name (retry)")
	labels := fs.String("selector", "", "retry every workflow these labels select, one at a time, as argo retry -l (retry)")
	uid := fs.String("uid", "", "the archived workflow's UID (retry-archived)")
	configmap := fs.String("configmap", "", "Argo's ConfigMap NAMESPACE/NAME (instance ID, persistence)")
	qps := fs.Float64("qps", 20, "client QPS (Argo Server 20, argo retry in kube mode 5)")
	burst := fs.Int("burst", 30, "client burst (Argo Server 30, argo retry in kube mode 10)")
	selector := fs.String("node-field-selector", "", "Argo's --node-field-selector")
	restartSuccessful := fs.Bool("restart-successful", false, "Argo's --restart-successful")
	var params parameters
	fs.Var(&params, "parameter", "a parameter override name=value (repeatable)")
	_ = fs.Parse(os.Args[2:])
	if *kubeconfig == "" || *namespace == "" || (!archived && (*name == "") == (*labels == "")) || (archived && (*uid == "" || *configmap == "")) {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	target := *namespace + "/" + *name
	if *labels != "" {
		target = *namespace + " -l " + *labels
	}
	if archived {
		target = *namespace + " archived " + *uid
	}
	if err := run(*kubeconfig, *configmap, *namespace, float32(*qps), *burst, func(ctx context.Context, s servers) (string, error) {
		if archived {
			wf, err := s.archive.RetryArchivedWorkflow(ctx, &workflowarchivepkg.RetryArchivedWorkflowRequest{
				Uid:               *uid,
				Namespace:         *namespace,
				RestartSuccessful: *restartSuccessful,
				NodeFieldSelector: *selector,
				Parameters:        params,
			})
			if err != nil {
				return "", err
			}
			return wf.Name, nil
		}
		retry := func(ctx context.Context, name string) error {
			_, err := s.workflow.RetryWorkflow(ctx, &workflowpkg.WorkflowRetryRequest{
				Name:              name,
				Namespace:         *namespace,
				RestartSuccessful: *restartSuccessful,
				NodeFieldSelector: *selector,
				Parameters:        params,
			})
			return err
		}
		if *labels == "" {
			return *name, retry(ctx, *name)
		}
		list, err := s.workflow.ListWorkflows(ctx, &workflowpkg.WorkflowListRequest{
			Namespace:   *namespace,
			ListOptions: &metav1.ListOptions{LabelSelector: *labels},
		})
		if err != nil {
			return "", err
		}
		for _, wf := range list.Items {
			call, err := s.withClients(ctx)
			if err != nil {
				return "", err
			}
			if err := retry(call, wf.Name); err != nil {
				return "", fmt.Errorf("%s: %w", wf.Name, err)
			}
		}
		return fmt.Sprintf("%d workflows", len(list.Items)), nil
	}); err != nil {
		fmt.Fprintf(os.Stderr, "peer %s %s: %v\n", os.Args[1], target, err)
		os.Exit(1)
	}
}

type servers struct {
	workflow workflow.Server
	archive  workflowarchivepkg.ArchivedWorkflowServiceServer
	// withClients gives a call clients of its own (a budget of its own), as
	// the gatekeeper does in client auth mode.
	withClients func(context.Context) (context.Context, error)
}

func run(kubeconfig, configmap, namespace string, qps float32, burst int, call func(context.Context, servers) (string, error)) error {
	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("reading kubeconfig %s: %w", kubeconfig, err)
	}
	restConfig.QPS, restConfig.Burst = qps, burst
	withClients := func(ctx context.Context) (context.Context, error) {
		kube, err := kubernetes.NewForConfig(restConfig)
		if err != nil {
			return nil, err
		}
		wf, err := versioned.NewForConfig(restConfig)
		if err != nil {
			return nil, err
		}
		ctx = context.WithValue(ctx, auth.WfKey, wf)
		return context.WithValue(ctx, auth.KubeKey, kube), nil
	}
	// Argo's code requires a logger in the context; warnings and errors, on stderr.
	ctx, err := withClients(logging.WithLogger(context.Background(),
		logging.NewSlogLoggerCustom(logging.Warn, logging.Text, os.Stderr)))
	if err != nil {
		return err
	}
	kube := auth.GetKubeClient(ctx)
	wf := auth.GetWfClient(ctx)

	// Without a ConfigMap: an Argo Server without persistence and without an
	// instance ID (the explosive repo, no archive).
	instanceID := ""
	offloadRepo := sqldb.ExplosiveOffloadNodeStatusRepo
	wfArchive := sqldb.NullWorkflowArchive
	if configmap != "" {
		cmNamespace, cmName, ok := strings.Cut(configmap, "/")
		if !ok {
			return fmt.Errorf("--configmap %q: expected NAMESPACE/NAME", configmap)
		}
		cfg, err := config.NewController(cmNamespace, cmName, kube).Get(ctx)
		if err != nil {
			return fmt.Errorf("reading Argo's ConfigMap %s: %w", configmap, err)
		}
		instanceID = cfg.InstanceID
		if p := cfg.Persistence; p != nil {
			// As argoserver.go: the offload repo and the archive are always on
			// when persistence is configured (the server only reads them).
			session, err := utilsqldb.NewSessionProxy(ctx, utilsqldb.SessionProxyConfig{
				KubectlConfig: kube,
				Namespace:     cmNamespace,
				DBConfig:      p.DBConfig,
			})
			if err != nil {
				return fmt.Errorf("connecting to Argo's database: %w", err)
			}
			tableName, err := sqldb.GetTableName(p)
			if err != nil {
				return err
			}
			offloadRepo, err = sqldb.NewOffloadNodeStatusRepo(ctx, logging.RequireLoggerFromContext(ctx), session, p.GetClusterName(), tableName)
			if err != nil {
				return err
			}
			wfArchive = sqldb.NewWorkflowArchive(session, p.GetClusterName(), "", instanceid.NewService(instanceID))
		}
	}
	instanceIDService := instanceid.NewService(instanceID)
	// No workflow store: RetryWorkflow reads the workflow from the API, and
	// ListWorkflows lists from it (the Argo Server's own lister is a cache).
	s := servers{
		workflow:    workflow.NewServer(ctx, instanceIDService, offloadRepo, wfArchive, wf, store.NewKubeLister(wf), nil, nil, nil, nil, &namespace, nil),
		archive:     workflowarchive.NewWorkflowArchiveServer(wfArchive, offloadRepo, nil),
		withClients: withClients,
	}
	start := time.Now()
	name, err := call(ctx, s)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"workflow": name, "seconds": time.Since(start).Seconds()})
}
