//! Integration tests on a real local control plane (see `rewind::testenv::localcluster`).
//!
//! One control plane (with scheduling and audit logging) serves the whole binary; every
//! test gets a fresh namespace. The control plane is stopped when the tests are done. If it
//! cannot be built or started, every test fails: these tests are never skipped.

mod admission;
mod argoapi;
mod budget;
mod bulk;
mod bulk_parallel;
mod cli;
mod concurrency;
mod db_restart;
mod endings;
mod faultproxy;
mod faults;
mod hostile;
mod idempotency;
mod install;
mod kills;
mod leader;
mod lifecycle;
mod listener;
mod mixed;
mod monitoring;
mod permissions;
mod pods;
mod races;
mod rbac;
mod restart;
mod retry;
mod scheduling;
mod settle;
mod support;
mod tenants;
mod throttle;
mod upgrade;
mod workflow_roundtrip;
mod workflowretry;
mod workflowretry_db;
mod workflowretry_kill;
mod workflowretry_once;

use std::process::ExitCode;
use std::sync::Arc;

use futures::future::Either;
use libtest_mimic::{Arguments, Failed, Trial};
use rewind::testenv::localcluster::{LocalCluster, Options};
use tracing_subscriber::EnvFilter;

use support::{Test, namespace_for};

/// The tests that need the control plane to themselves (see `quiet` in `main`).
const ALONE: &[&str] = &[
    "hostile::a_thousand_workflowretries_in_one_namespace_do_not_slow_another",
    "tenants::a_quiet_tenants_retry_keeps_its_pace_beside_many_busy_tenants",
    "cli::a_bulk_delete_shows_its_count_rising_each_second",
    "listener::argos_retry_api_stays_small_and_answers_a_real_caller_under_attack",
    // Sets the cluster's CRD back to the previous chart's, and installs the chart's
    // cluster-wide user roles, named as install::'s, for its duration.
    "upgrade::the_previous_chart_upgraded_mid_retry_ends_the_request_once_and_keeps_its_objects",
    "faults::a_held_pod_among_20000_costs_a_list_a_second_at_most",
];

/// The tests too long for every test run (minutes of set-up): `-- --ignored NAME` runs one.
const IGNORED: &[&str] = &["faults::a_held_pod_among_20000_costs_a_list_a_second_at_most"];

/// The compatibility subset, what differs between Kubernetes minors: the chart
/// (CRD, ValidatingAdmissionPolicy, RBAC) installed with Helm, a live bulk retry
/// followed by the protobuf watch, an archived retry, WorkflowRetry, Argo's API
/// (TokenReview, SubjectAccessReview), leader election (Lease) and priority and
/// fairness. `REWIND_TEST_SUBSET=compat` runs only these (`make test-compat`).
const COMPAT: &[&str] = &[
    "pods::delete_collection_removes_exactly_the_unsucceeded_pods_at_once",
    "install::the_chart_installs_and_its_service_account_serves_a_users_retry",
    "admission::a_workflowretry_needs_what_argo_would_need_of_the_same_user",
    "bulk::an_unfinished_outsider_survives_and_an_unrelabelled_plan_pod_goes_singly",
    "workflowretry::a_live_workflowretry_resets_the_workflow_reports_and_expires",
    "workflowretry::an_archived_workflowretry_deletes_only_leftovers_and_creates_the_workflow_once",
    "argoapi::argos_retry_call_is_authorized_like_argos_and_answers_the_reset_workflow",
    "leader::a_killed_leader_is_replaced_and_the_retry_resets_exactly_once",
    "throttle::a_retry_throttled_by_priority_and_fairness_obeys_retry_after",
];

macro_rules! tests {
    ($($module:ident :: $test:ident),* $(,)?) => {
        vec![$((concat!(stringify!($module), "::", stringify!($test)), (|cluster, namespace| {
            Box::pin($module::$test(cluster, namespace))
        }) as Test)),*]
    };
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("rewind=info,cluster=info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut tests = tests![
        pods::delete_collection_removes_exactly_the_unsucceeded_pods_at_once,
        rbac::user_can_patch_workflows_but_not_touch_pods,
        permissions::a_controller_without_pod_delete_fails_each_request_at_once_and_deletes_nothing,
        workflow_roundtrip::typed_replace_loses_nothing_of_a_large_workflow,
        scheduling::a_pod_is_scheduled_onto_a_fake_node_and_runs,
        scheduling::audit_log_has_one_line_per_request,
        lifecycle::stop_leaves_no_process_and_no_directory,
        lifecycle::a_taken_port_is_a_clear_error,
        lifecycle::a_missing_binary_is_a_clear_error,
        lifecycle::a_component_exiting_at_startup_is_a_clear_error_with_its_log,
        retry::retry_resets_as_planned_and_deletes_exactly_the_plan_pods,
        retry::a_plan_pod_replaced_before_its_delete_is_kept_and_stops_the_retry,
        retry::the_reset_is_written_after_the_last_plan_pod_is_gone,
        retry::pods_held_by_argos_finalizer_are_released_and_other_finalizers_respected,
        retry::a_workflow_that_runs_again_mid_retry_stops_the_deletions,
        retry::a_new_token_during_a_retry_is_served_after_it,
        bulk::an_unfinished_outsider_survives_and_an_unrelabelled_plan_pod_goes_singly,
        bulk::a_pod_created_during_a_long_bulk_delete_survives,
        bulk::a_graceful_stop_right_after_a_reset_still_sends_its_event,
        bulk_parallel::a_split_bulk_delete_sends_one_request_per_part_and_keeps_every_outsider,
        budget::a_user_retry_overtakes_a_background_backlog,
        budget::every_mutating_request_goes_through_the_budget_and_keeps_its_rate,
        idempotency::a_controller_killed_mid_retry_resumes_and_resets_exactly_once,
        restart::a_live_workflowretry_resumed_during_a_slow_initial_list_ends,
        restart::a_request_whose_answer_was_refused_is_answered_later,
        workflowretry::the_api_server_refuses_both_or_neither_target_and_a_changed_spec,
        workflowretry::a_live_workflowretry_resets_the_workflow_reports_and_expires,
        workflowretry::an_archived_workflowretry_deletes_only_leftovers_and_creates_the_workflow_once,
        workflowretry::workflowretries_that_cannot_be_served_fail_clearly_and_delete_nothing,
        workflowretry::an_archived_retry_stopped_before_the_create_resumes_and_creates_once,
        workflowretry_db::an_archived_retry_on_postgresql,
        workflowretry_db::an_archived_retry_on_mariadb,
        workflowretry_db::an_offloaded_live_retry_on_postgresql,
        workflowretry_db::an_offloaded_live_retry_on_mariadb,
        workflowretry_kill::an_archived_retry_killed_before_and_after_the_create_creates_the_workflow_once,
        workflowretry_once::an_archived_retry_whose_end_is_not_recorded_never_creates_again,
        workflowretry_once::an_archived_retry_resumed_in_its_create_creates_exactly_once,
        workflowretry_once::a_resumed_live_workflowretry_never_asks_twice,
        workflowretry_once::a_workflowretry_never_overwrites_a_users_request_asked_meanwhile,
        cli::retry_in_a_terminal_shows_progress_then_the_summary_or_the_refusal,
        cli::a_bulk_delete_shows_its_count_rising_each_second,
        cli::a_batch_waiting_in_the_controllers_queue_is_followed_to_its_end,
        cli::dry_run_prints_the_planners_plan_and_changes_nothing,
        cli::piped_output_json_selector_and_no_wait,
        cli::without_a_controller_retry_says_so_and_how_to_check,
        cli::ctrl_c_stops_following_and_leaves_the_request,
        cli::archived_retry_creates_a_workflowretry_and_follows_it_to_the_end,
        cli::archived_dry_run_is_a_server_side_dry_run_that_creates_nothing,
        cli::archived_retry_without_a_controller_says_so_and_how_to_check,
        leader::a_killed_leader_is_replaced_and_the_retry_resets_exactly_once,
        leader::a_graceful_stop_releases_the_lease_at_once,
        leader::a_leader_that_cannot_renew_stops_before_its_lease_expires,
        install::the_chart_installs_and_its_service_account_serves_a_users_retry,
        upgrade::the_previous_chart_upgraded_mid_retry_ends_the_request_once_and_keeps_its_objects,
        admission::a_workflowretry_needs_what_argo_would_need_of_the_same_user,
        argoapi::argos_retry_call_is_authorized_like_argos_and_answers_the_reset_workflow,
        argoapi::argos_archived_retry_call_creates_the_workflow,
        argoapi::a_double_click_on_retry_resets_once_and_answers_both_calls,
        argoapi::in_server_mode_a_call_acts_as_the_argo_servers_account,
        argoapi::in_sso_mode_a_call_acts_as_the_account_argos_sso_rbac_maps_the_user_to,
        listener::argos_retry_api_stays_small_and_answers_a_real_caller_under_attack,
        argoapi::with_sso_delegation_a_call_acts_as_the_namespaces_account_as_in_argo,
        faultproxy::the_fault_proxy_holds_throttles_stalls_cuts_drops_and_serves_stale_lists,
        races::a_throttled_bulk_delete_never_takes_a_pod_created_after_its_proof,
        races::a_pod_created_under_a_planned_name_after_the_read_is_never_deleted,
        races::a_delete_waiting_out_a_429_is_not_sent_after_its_request_stopped,
        faults::a_delete_collection_past_the_request_timeout_answers_504_and_stops,
        faults::a_bulk_delete_past_the_request_timeout_is_relisted_not_resent,
        faults::an_archived_bulk_delete_past_the_request_timeout_is_relisted_not_resent,
        faults::a_concurrent_writer_loses_no_update_and_the_workflow_is_reset_once,
        faults::a_reset_whose_answer_is_lost_ends_succeeded,
        faults::a_failed_proof_list_sends_nothing_and_keeps_bulk_deletes,
        faults::a_proof_answered_late_sends_nothing_and_keeps_a_recreated_pod,
        faults::bulk_deletes_never_proved_in_time_go_one_by_one,
        faults::a_stopped_request_reports_after_its_delete_under_way_ends,
        faults::a_controller_told_to_stop_leaves_within_its_grace_period,
        faults::a_proof_list_that_waited_for_its_read_turn_still_deletes_in_bulk,
        faults::an_archived_create_recorded_never_ends_failed_for_its_finalizer,
        faults::a_bulk_delete_waiting_for_a_slot_holds_up_no_other_work,
        faults::a_throttled_bulk_delete_is_proved_again_not_given_up,
        faults::a_held_pod_among_20000_costs_a_list_a_second_at_most,
        throttle::a_retry_throttled_by_priority_and_fairness_obeys_retry_after,
        hostile::malformed_and_oversize_annotations_each_fail_clearly_and_delete_nothing,
        concurrency::a_retry_past_the_bound_waits_pending_then_both_end_as_planned,
        concurrency::bulk_deletes_past_the_bound_wait_their_turn_in_the_controller,
        hostile::workflowretry_fields_past_their_bounds_are_refused_and_at_them_served,
        hostile::a_compressed_nodes_bomb_fails_its_request_and_the_controller_stays_small,
        hostile::a_thousand_workflowretries_in_one_namespace_do_not_slow_another,
        tenants::a_quiet_tenants_retry_keeps_its_pace_beside_many_busy_tenants,
        db_restart::an_archived_retry_survives_a_database_restart_during_its_deletes,
        db_restart::an_archived_retry_waits_for_a_database_down_at_its_start,
        db_restart::an_archived_retry_survives_a_mariadb_restart_during_its_deletes,
        kills::a_live_retry_killed_at_random_moments_resets_once_as_planned,
        kills::an_archived_retry_killed_at_random_moments_creates_once_as_planned,
        mixed::randomized_requests_faults_and_kills_keep_every_invariant,
        monitoring::a_scraped_retry_gives_every_panel_data_and_raises_no_alert,
        endings::two_workflowretries_of_one_archived_workflow_both_end,
        endings::a_pod_that_will_not_go_is_named_then_fails_its_retry_and_frees_its_share,
        endings::a_held_pod_is_followed_on_the_watch_not_by_lists,
        settle::a_pod_argo_never_labels_ends_its_retry_at_the_settle_bound,
        settle::a_stranded_reset_node_is_reported_with_its_fix,
    ];
    for named in ALONE.iter().chain(COMPAT).chain(IGNORED) {
        assert!(
            tests.iter().any(|(name, _)| name == named),
            "ALONE, COMPAT or IGNORED names {named}, which is no test"
        );
    }
    match std::env::var("REWIND_TEST_SUBSET").as_deref() {
        Err(_) => {}
        Ok("compat") => tests.retain(|(name, _)| COMPAT.contains(name)),
        Ok(other) => {
            eprintln!("error: REWIND_TEST_SUBSET={other} is no subset; the one subset is compat");
            return ExitCode::FAILURE;
        }
    }
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");

    let listed: Vec<Trial> = tests
        .iter()
        .map(|(name, _)| Trial::test(*name, || Ok(())).with_ignored_flag(IGNORED.contains(name)))
        .collect();
    let anything_to_run = !args.list
        && listed
            .iter()
            .any(|t| !args.is_filtered_out(t) && !args.is_ignored(t));
    let cluster = if anything_to_run {
        let options = Options {
            scheduling: true,
            audit: true,
            ..Options::default()
        };
        match runtime.block_on(LocalCluster::start(options)) {
            Ok(cluster) => Some(Arc::new(cluster)),
            Err(error) => {
                eprintln!(
                    "error: the local control plane did not start, so every test fails:\n{error}"
                );
                None
            }
        }
    } else {
        None
    };

    // Tests that compare times run with the control plane to themselves: the others
    // take this lock shared, these exclusively, so no other test's load lands in their
    // figures.
    let quiet = Arc::new(tokio::sync::RwLock::new(()));
    let trials = tests
        .into_iter()
        .map(|(name, test)| {
            let cluster = cluster.clone();
            let handle = runtime.handle().clone();
            let quiet = quiet.clone();
            Trial::test(name, move || {
                let cluster = cluster.ok_or_else(|| {
                    Failed::from("the local control plane did not start (see above)")
                })?;
                handle
                    .block_on(async {
                        let _quiet = match ALONE.contains(&name) {
                            true => Either::Left(quiet.write().await),
                            false => Either::Right(quiet.read().await),
                        };
                        let namespace = namespace_for(name);
                        cluster.create_namespace(&namespace).await?;
                        test(cluster, namespace).await
                    })
                    .map_err(|error| Failed::from(format!("{error:#}")))
            })
            .with_ignored_flag(IGNORED.contains(&name))
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);

    if let Some(cluster) = cluster {
        // Every trial (and its clone) is dropped once `run` returns.
        let Ok(cluster) = Arc::try_unwrap(cluster) else {
            eprintln!("error: a test kept the local control plane alive");
            return ExitCode::FAILURE;
        };
        if let Err(error) = runtime.block_on(cluster.stop()) {
            eprintln!("error: stopping the local control plane: {error}");
            return ExitCode::FAILURE;
        }
    }
    conclusion.exit_code()
}
