// Command peer runs Argo Workflows v4's own retry, in process, against a
// cluster: the Argo Server's RetryWorkflow (server/workflow/workflow_server.go)
// called directly, with the caller's clients in the context as the server's
// gatekeeper puts them there. It is the yardstick rewind is compared with, in
// the end-to-end tests and the benchmarks.
//
//	peer retry --kubeconfig K --namespace N --name W [--qps 20 --burst 30]
//	           [--node-field-selector S] [--parameter name=value]... [--restart-successful]
//
// --qps/--burst 20/30 is the Argo Server's default budget, 5/10 is `argo retry`
// without a server (client-go's defaults). On success it prints one JSON line:
// {"workflow": NAME, "seconds": ELAPSED}.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/argoproj/argo-workflows/v4/persist/sqldb"
	workflowpkg "github.com/argoproj/argo-workflows/v4/pkg/apiclient/workflow"
	"github.com/argoproj/argo-workflows/v4/pkg/client/clientset/versioned"
	"github.com/argoproj/argo-workflows/v4/server/auth"
	"github.com/argoproj/argo-workflows/v4/server/workflow"
	"github.com/argoproj/argo-workflows/v4/util/instanceid"
	"github.com/argoproj/argo-workflows/v4/util/logging"
)

type parameters []string

func (p *parameters) String() string     { return strings.Join(*p, ",") }
func (p *parameters) Set(v string) error { *p = append(*p, v); return nil }

func main() {
	if len(os.Args) < 2 || os.Args[1] != "retry" {
		fmt.Fprintln(os.Stderr, "usage: peer retry --kubeconfig K --namespace N --name W [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("retry", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the caller")
	namespace := fs.String("namespace", "", "the workflow's namespace")
	name := fs.String("name", "", "the workflow's name")
	qps := fs.Float64("qps", 20, "client QPS (Argo Server 20, argo retry in kube mode 5)")
	burst := fs.Int("burst", 30, "client burst (Argo Server 30, argo retry in kube mode 10)")
	selector := fs.String("node-field-selector", "", "Argo's --node-field-selector")
	restartSuccessful := fs.Bool("restart-successful", false, "Argo's --restart-successful")
	var params parameters
	fs.Var(&params, "parameter", "a parameter override name=value (repeatable)")
	_ = fs.Parse(os.Args[2:])
	if *kubeconfig == "" || *namespace == "" || *name == "" {
		fmt.Fprintln(os.Stderr, "peer retry: --kubeconfig, --namespace and --name are required")
		os.Exit(2)
	}
	if err := retry(*kubeconfig, *namespace, *name, float32(*qps), *burst, &workflowpkg.WorkflowRetryRequest{
		Name:              *name,
		Namespace:         *namespace,
		RestartSuccessful: *restartSuccessful,
		NodeFieldSelector: *selector,
		Parameters:        params,
	}); err != nil {
		fmt.Fprintf(os.Stderr, "peer retry %s/%s: %v\n", *namespace, *name, err)
		os.Exit(1)
	}
}

func retry(kubeconfig, namespace, name string, qps float32, burst int, req *workflowpkg.WorkflowRetryRequest) error {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("reading kubeconfig %s: %w", kubeconfig, err)
	}
	config.QPS, config.Burst = qps, burst
	kube, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	wf, err := versioned.NewForConfig(config)
	if err != nil {
		return err
	}
	// Argo's code requires a logger in the context; warnings and errors, on stderr.
	ctx := logging.WithLogger(context.Background(),
		logging.NewSlogLoggerCustom(logging.Warn, logging.Text, os.Stderr))
	ctx = context.WithValue(ctx, auth.WfKey, wf)
	ctx = context.WithValue(ctx, auth.KubeKey, kube)
	// As an Argo Server without persistence and without an instance ID: the
	// explosive repo, no archive, no workflow store (RetryWorkflow reads the
	// workflow from the API).
	server := workflow.NewServer(ctx, instanceid.NewService(""), sqldb.ExplosiveOffloadNodeStatusRepo,
		nil, wf, nil, nil, nil, nil, nil, &namespace, nil)
	start := time.Now()
	if _, err := server.RetryWorkflow(ctx, req); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"workflow": name, "seconds": time.Since(start).Seconds()})
}
