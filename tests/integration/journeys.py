"""The end-to-end journeys: the playbooks as a user types them, one after another, on each provider
(create, agent, relay push, checkpoint, restore, destroy; fleets over remote engines; the fleet page in
Chromium). They carry the `journey` mark (tests/integration/conftest.py), so they run on their own with
`pytest -m journey` (about 40 tests); the whole suite runs them with everything else.
tests/unit/test_journeys.py checks that every name here is a test that exists."""

from __future__ import annotations

JOURNEYS = (
    # Local engine: create, list, switch, ssh, editors, ports, files, destroy.
    "box/test_box_local.py::test_playbooks_create_list_switch_destroy",
    "access/test_access.py::test_first_create_without_a_key_makes_one_and_ssh_has_one_form",
    "access/test_access.py::test_ssh_alias_and_web_url_of_a_box_restored_from_a_checkpoint",
    "access/test_access.py::test_attach_uri_resume_and_include",
    "access/test_access.py::test_forward_local_and_web_url_after_start",
    "access/test_forward.py::test_forwards_end_when_the_box_stops_and_when_it_is_destroyed",
    "box/test_download_trust.py::test_download_brings_files_links_empty_files_and_odd_names_byte_for_byte",
    "box/test_files_in_and_out.py::test_fetch_branch_on_the_local_engine_imports_the_box_commits",
    "playbooks/test_playbook_output.py::test_ports_read_the_same_in_create_and_list",
    "image/test_stream_progress.py::test_first_image_stream_prints_progress_and_figures",
    # Agents in boxes, their states, and their work leaving through the relay.
    "agent/test_agent_box.py::test_custom_command_states_reach_the_inventory_and_survive_a_stop_and_start",
    "agent/test_agent_box.py::test_a_running_agent_takes_prompts_shows_its_screen_and_stalls_without_progress",
    "agent/test_agent_claude_code.py::test_claude_code_end_to_end_with_a_scripted_api_in_the_box",
    "egress/test_egress_agent.py::test_claude_code_gets_the_hosts_key_added_by_the_gateway_and_the_box_never_holds_it",
    "relay/test_relay.py::test_push_lands_on_an_origin_the_box_cannot_reach",
    "relay/test_relay.py::test_push_as_main_waits_is_denied_then_approved",
    "relay/test_relay.py::test_relay_restart_and_box_stop_start_keep_commands_working",
    "bestof/test_best_of.py::test_best_of_five_runs_the_check_judges_adopt_brings_the_winner_and_keep_winner_removes_the_rest",
    # Checkpoints: take, list, restore into new boxes, remove.
    "checkpoint/test_checkpoints_playbook.py::test_checkpoints_lists_then_removes_one_in_check_mode_and_for_real",
    "playbooks/test_playbook_output.py::"
    "test_a_create_from_a_checkpoint_names_it_counts_what_it_carried_and_warns_of_host_edits_left_out",
    "project/test_init_checkpoint.py::test_init_with_checkpoint_installs_once_and_new_boxes_start_with_it_done",
    # Remote engines over SSH, and fleets over two of them.
    "providers/docker/test_docker_ssh.py::test_two_engines_carry_over_commands_fetch_back_destroy",
    "providers/docker/test_docker_ssh.py::test_checkpoint_copied_to_another_engine_starts_boxes_there",
    "providers/docker/test_docker_ssh.py::test_fleet_playbook_spreads_boxes_over_engines",
    "providers/docker/test_docker_ssh.py::test_prepare_streams_the_image_to_an_engine_once_and_records_it",
    "access/test_access_remote_engine.py::test_ssh_alias_and_named_shells_of_a_box_on_a_remote_engine",
    "providers/docker/test_unisolated_boxes.py::"
    "test_box_on_the_user_engine_works_through_inventory_connection_ssh_state_and_destroy",
    # The fleet page in Chromium.
    "fleet/test_fleet_status.py::test_fleet_status_numbers_table_and_html",
    "fleet/test_fleet_status_installed.py::test_fleet_status_from_another_directory_and_installed_collection",
    # Daytona (emulator, real SDK).
    "providers/daytona/test_daytona_provider.py::test_create_box_playbook_seeds_a_sandbox_byte_identically",
    "providers/daytona/test_daytona_provider.py::test_pause_and_resume",
    "providers/daytona/test_daytona_provider.py::test_destroy_leaves_no_sandbox_snapshot_or_container",
    "providers/daytona/test_daytona_files.py::test_files_in_and_out_and_the_restore_hint_on_daytona",
    "providers/daytona/test_daytona_ssh.py::test_the_alias_follows_a_stop_and_a_start",
    # boxd (emulator, real SDK).
    "providers/boxd/test_boxd_provider.py::test_box_state_and_inventory_connection",
    "providers/boxd/test_boxd_provider.py::test_checkpoint_restored_into_a_new_box",
    "agent/test_agent_boxd.py::test_claude_code_on_boxd_with_a_scripted_api_in_the_box",
    # The machine as a whole, and the docs' own commands.
    "tasks/test_doctor.py::test_doctor_on_this_machine_says_what_is_missing_then_ok",
    "docs/test_doc_commands.py::test_every_doc_command_is_run_or_says_why_not",
)
