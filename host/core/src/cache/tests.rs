use super::*;

#[test]
fn k1_the_config_overrides_the_documented_rules_and_refuses_impossible_values() {
    let config = crate::config::Config::parse(
        "[cache.anthropic]\nmin_tokens = 2048\nttl_s = 600\n[cache.openai]\nread = 0.25\n",
        "t",
    )
    .unwrap();
    let a = Rules::of(Format::Anthropic, "claude-sonnet-4-5", &config.cache).unwrap();
    assert_eq!((a.min_tokens, a.ttl_ms, a.read), (2048, 600_000, 0.1));
    let o = Rules::of(Format::OpenaiResponses, "gpt-5", &config.cache).unwrap();
    assert_eq!((o.read, o.min_tokens), (0.25, 1024));
    assert_eq!(Rules::of(Format::Neutral, "x", &config.cache), None);
    for (text, key) in [
        ("[cache.openai]\nread = -1.0\n", "[cache.openai] read"),
        (
            "[cache.anthropic]\nstep_tokens = 0\n",
            "[cache.anthropic] step_tokens",
        ),
        ("[cache.anthropic]\nttl = 5\n", "ttl"),
        (
            "[pricing.\"gpt-5\"]\ninput = -2.0\noutput = 1.0\n",
            "[pricing.\"gpt-5\"] input",
        ),
    ] {
        let e = crate::config::Config::parse(text, "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{text}: {e}");
    }
}

const MIN: u64 = 60_000;

fn anthropic() -> Cache {
    Cache::new(Rules::anthropic("claude-sonnet-4-5"))
}

/// Tools and system (one breakpoint), then messages with a breakpoint on the last.
fn turn(at: u64, head: u64, messages: &[(u64, u64)]) -> Request {
    let mut blocks = vec![Block::new(head, 2000, Some(Ttl::Minutes5))];
    for (i, &(hash, tokens)) in messages.iter().enumerate() {
        let last = i + 1 == messages.len();
        blocks.push(Block::new(hash, tokens, last.then_some(Ttl::Minutes5)));
    }
    Request::new(at, blocks)
}

#[test]
fn anthropic_a_growing_conversation_reads_what_it_wrote_and_writes_what_it_adds() {
    let mut c = anthropic();
    let a = c.serve(&turn(0, 1, &[(10, 300)]));
    assert_eq!(
        (a.read, a.written, a.uncached, a.cause),
        (0, 2300, 0, Cause::Cold)
    );
    let b = c.serve(&turn(MIN, 1, &[(10, 300), (11, 200)]));
    assert_eq!((b.read, b.written, b.cause), (2300, 200, Cause::Hit));
}

#[test]
fn anthropic_an_entry_lives_five_minutes_from_its_last_use_and_a_hit_refreshes_it() {
    let mut c = anthropic();
    c.serve(&turn(0, 1, &[(10, 300)]));
    // Every 4 minutes: each hit restarts the clock.
    for k in 1..=5 {
        let s = c.serve(&turn(4 * MIN * k, 1, &[(10, 300)]));
        assert_eq!((s.read, s.cause), (2300, Cause::Hit), "hit {k}");
    }
    let idle = c.serve(&turn(20 * MIN + 5 * MIN + 1, 1, &[(10, 300)]));
    assert_eq!(
        (idle.read, idle.written, idle.cause),
        (0, 2300, Cause::Expired)
    );
}

#[test]
fn anthropic_a_read_through_a_longer_breakpoint_refreshes_the_shorter_entries_it_covers() {
    let mut c = anthropic();
    c.serve(&turn(0, 1, &[(10, 300)]));
    // Four minutes on, the conversation grows: the 2,300-token entry is read, and the
    // 2,000-token head written at 0 was read through, so it lives on too.
    let b = c.serve(&turn(4 * MIN, 1, &[(10, 300), (11, 200)]));
    assert_eq!((b.read, b.cause), (2300, Cause::Hit));
    // Seven minutes from the head's write, three from its last use: a changed message
    // still reads the head.
    let d = c.serve(&turn(7 * MIN, 1, &[(12, 300)]));
    assert_eq!((d.read, d.written), (2000, 300));
}

#[test]
fn anthropic_one_hour_entries_outlive_the_five_minute_ones_and_cost_twice_input() {
    let rules = Rules::anthropic("claude-sonnet-4-5");
    let mut c = Cache::new(rules.clone());
    let long = |at| {
        Request::new(
            at,
            vec![
                Block::new(1, 2000, Some(Ttl::Hour1)),
                Block::new(2, 1500, Some(Ttl::Minutes5)),
            ],
        )
    };
    let first = c.serve(&long(0));
    assert_eq!((first.written_1h, first.written), (2000, 1500));
    assert_eq!(first.cost(&rules, 1.0), 2000.0 * 2.0 + 1500.0 * 1.25);
    let later = c.serve(&long(30 * MIN));
    // The 1-hour part is read; the 5-minute part expired and is written again.
    assert_eq!(
        (later.read, later.written, later.cause),
        (2000, 1500, Cause::Expired)
    );
    assert_eq!(later.cost(&rules, 1.0), 2000.0 * 0.1 + 1500.0 * 1.25);
}

#[test]
fn anthropic_a_prefix_below_the_model_minimum_is_never_cached() {
    let mut c = Cache::new(Rules::anthropic("claude-haiku-4-5"));
    let short = |at| Request::new(at, vec![Block::new(1, 3000, Some(Ttl::Minutes5))]);
    for at in [0, MIN] {
        let s = c.serve(&short(at));
        assert_eq!(
            (s.read, s.written, s.uncached, s.cause),
            (0, 0, 3000, Cause::TooShort)
        );
    }
    assert_eq!(Rules::anthropic("claude-3-haiku").min_tokens, 2048);
    assert_eq!(Rules::anthropic("claude-opus-4-1").min_tokens, 1024);
}

#[test]
fn anthropic_a_hit_is_found_up_to_twenty_blocks_before_a_breakpoint_and_not_beyond() {
    let mut c = anthropic();
    let many = |at, n: u64| {
        let mut blocks = vec![Block::new(1, 2000, Some(Ttl::Minutes5))];
        blocks.extend((0..n).map(|i| Block::new(100 + i, 10, None)));
        if let Some(last) = blocks.last_mut() {
            last.breakpoint = Some(Ttl::Minutes5);
        }
        Request::new(at, blocks)
    };
    // Remove the system breakpoint's help: only the messages' breakpoint is looked back from.
    c.serve(&many(0, 5));
    let near = many(MIN, 25); // the cached end (block 5) is 20 blocks before block 25
    let s = c.serve(&near);
    assert_eq!(s.read, 2050, "found by the lookback");
    let mut c = anthropic();
    let mut far_first = many(0, 5);
    far_first.blocks[0].breakpoint = None;
    c.serve(&far_first);
    let mut far = many(MIN, 27); // 22 blocks after the cached end
    far.blocks[0].breakpoint = None;
    let s = c.serve(&far);
    assert_eq!(s.read, 0, "beyond the lookback");
}

#[test]
fn anthropic_only_four_breakpoints_are_honoured() {
    let mut c = anthropic();
    let blocks = (0..6)
        .map(|i| Block::new(i, 1100, Some(Ttl::Minutes5)))
        .collect();
    let s = c.serve(&Request::new(0, blocks));
    assert_eq!((s.written, s.uncached), (4 * 1100, 2 * 1100));
}

#[test]
fn a_changed_block_is_named_as_the_first_difference() {
    let mut c = anthropic();
    c.serve(&turn(0, 1, &[(10, 300)]));
    let s = c.serve(&turn(MIN, 2, &[(10, 300)]));
    assert_eq!((s.read, s.cause), (0, Cause::PrefixChanged { block: 0 }));
}

#[test]
fn openai_caches_from_1024_tokens_in_128_token_steps() {
    let mut c = Cache::new(Rules::openai(0.5));
    let req = |at, tail| {
        Request::new(
            at,
            vec![
                Block::new(1, 1000, None),
                Block::new(2, 300, None),
                Block::new(tail, 40, None),
            ],
        )
    };
    let first = c.serve(&req(0, 7));
    assert_eq!((first.read, first.cause), (0, Cause::Cold));
    let second = c.serve(&req(MIN, 8));
    // The cached prefix ends at 1,300 tokens: 1,280 in 128-token steps.
    assert_eq!((second.read, second.cause), (1280, Cause::Partial));
    let short = Request::new(2 * MIN, vec![Block::new(9, 900, None)]);
    assert_eq!(c.serve(&short).cause, Cause::TooShort);
}

#[test]
fn openai_past_the_per_key_rate_requests_spill_to_cold_machines() {
    let mut c = Cache::new(Rules::openai(0.5));
    let req = |at| {
        let mut r = Request::new(
            at,
            vec![Block::new(1, 2048, None), Block::new(at, 10, None)],
        );
        r.key = Some("promptd-s1".into());
        r
    };
    // 20 requests in one minute: the first 15 on one machine, the rest on the next.
    let served: Vec<Served> = (0..20).map(|i| c.serve(&req(i * 2_000))).collect();
    assert_eq!(served[0].cause, Cause::Cold);
    assert!(served[1..15].iter().all(|s| s.read == 2048), "{served:?}");
    assert_eq!((served[15].read, served[15].cause), (0, Cause::Routing));
    assert_eq!(served[16].read, 2048, "the second machine is warm now");
}

#[test]
fn openai_another_key_is_another_route() {
    let mut c = Cache::new(Rules::openai(0.5));
    let req = |at, key: &str| {
        let mut r = Request::new(at, vec![Block::new(1, 2048, None)]);
        r.key = Some(key.into());
        r
    };
    c.serve(&req(0, "a"));
    assert_eq!(c.serve(&req(1_000, "a")).cause, Cause::Hit);
    assert_eq!(c.serve(&req(2_000, "b")).read, 0, "its own route, cold");
}

#[test]
fn the_model_forgets_what_can_no_longer_be_served() {
    let mut c = anthropic();
    for i in 0..1000u64 {
        c.serve(&turn(i * 10 * MIN, i, &[(i, 300)]));
    }
    assert!(c.entries.len() <= 2, "{} live entries", c.entries.len());
    // Prefixes are remembered for four of the longest TTL (to tell expired from new): two
    // per request, one request every 10 minutes, over 4 hours.
    assert!(
        c.seen.len() <= 2 * 25,
        "{} remembered prefixes",
        c.seen.len()
    );
}
