//! Load and hostile clients at once: 500 open connections, a subscriber to
//! every topic that never reads while 2,000 instances run, 2 MB lines, a
//! 10,000-element batch, invalid UTF-8 and well-formed but wrong requests.
//! The agent answers each wrong request with an error that says what was
//! wrong, its memory stays bounded, every instance finishes, and an ordinary
//! client keeps being answered. (The latency figures are reported here and in
//! the README; the bound asserted is generous, since machines are shared.)

use apollo_tests::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

fn send_line(s: &mut UnixStream, bytes: &[u8]) {
    s.write_all(bytes).unwrap();
    s.write_all(b"\n").unwrap();
}

fn read_answer(r: &mut BufReader<UnixStream>) -> Value {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:.200}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_get_errors_memory_stays_bounded_and_others_are_served() {
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 8\n")
        .task("noop.yaml", "task: noop\nsteps:\n  - plugin: sleep\n    params:\n      seconds: 0\n")
        .start();
    let pid = agent.pid();
    let rss_idle = peak_rss_kib(pid);
    // 500 connections, each having said hello, left open.
    let mut idle = Vec::new();
    for i in 0..500 {
        let mut s = UnixStream::connect(&agent.socket).unwrap();
        send_line(
            &mut s,
            format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"hello","params":{{"client":"idle"}}}}"#).as_bytes(),
        );
        idle.push(s);
    }
    // A subscriber to every topic that never reads.
    let mut deaf = UnixStream::connect(&agent.socket).unwrap();
    send_line(
        &mut deaf,
        br#"{"jsonrpc":"2.0","id":1,"method":"subscribe","params":{"topics":["tasks","defs","alerts","queues"]}}"#,
    );

    // An ordinary client measures its latency throughout.
    let probe = agent.client().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probing = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut lat = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                probe.request::<m::AgentStatus>(NoParams {}).await.expect("the ordinary client is answered");
                lat.push(t.elapsed());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            lat
        })
    };

    // 2,000 instances from 16 callers.
    let started = Instant::now();
    let mut callers = Vec::new();
    for _ in 0..16 {
        let c = agent.client().await;
        callers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..125 {
                ids.push(trigger(&c, "noop", json!({})).await);
            }
            ids
        }));
    }

    // Meanwhile, the hostile ones, each answered with what was wrong.
    let socket = agent.socket.clone();
    let hostile = tokio::task::spawn_blocking(move || {
        let s = UnixStream::connect(&socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        let mut tried = 0;
        let mut expect = |w: &mut UnixStream, r: &mut BufReader<UnixStream>, bytes: &[u8], code: i64, says: &str| {
            send_line(w, bytes);
            let a = read_answer(r);
            assert_eq!(a["error"]["code"], code, "{:.300}", a.to_string());
            let m = a["error"]["message"].as_str().unwrap();
            assert!(m.contains(says), "{m}");
            assert!(m.len() <= 2048, "an error echoed {} bytes", m.len());
            tried += 1;
        };
        for _ in 0..3 {
            expect(&mut w, &mut r, &vec![b'x'; 2 << 20], -32600, "frame longer than");
        }
        let batch: Vec<Value> =
            (0..10_000).map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "agent.status"})).collect();
        expect(
            &mut w,
            &mut r,
            serde_json::to_string(&batch).unwrap().as_bytes(),
            -32600,
            "batch requests are not supported",
        );
        expect(&mut w, &mut r, b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\xfe\"}", -32700, "not UTF-8");
        expect(&mut w, &mut r, br#"{"jsonrpc":"2.0","id":2,"method":"tasks.explode"}"#, -32601, "unknown method");
        expect(
            &mut w,
            &mut r,
            br#"{"jsonrpc":"2.0","id":3,"method":"tasks.get","params":{"id":7}}"#,
            -32602,
            "tasks.get",
        );
        expect(
            &mut w,
            &mut r,
            br#"{"jsonrpc":"2.0","id":4,"method":"tasks.list","params":{"limit":0}}"#,
            -32602,
            "limit 0",
        );
        expect(
            &mut w,
            &mut r,
            br#"{"jsonrpc":"2.0","id":5,"method":"tasks.trigger","params":{"task":"nope"}}"#,
            -32004,
            "no task",
        );
        let huge_id =
            format!(r#"{{"jsonrpc":"2.0","id":6,"method":"tasks.get","params":{{"id":"{}"}}}}"#, "z".repeat(900_000));
        expect(&mut w, &mut r, huge_id.as_bytes(), -32004, "no instance");
        expect(&mut w, &mut r, br#"[1, 2"#, -32700, "parse error");
        // Still a working connection.
        send_line(&mut w, br#"{"jsonrpc":"2.0","id":9,"method":"agent.status"}"#);
        assert!(read_answer(&mut r)["result"]["pid"].is_u64());
        tried
    });

    let mut ids = Vec::new();
    for c in callers {
        ids.extend(c.await.unwrap());
    }
    let tried = hostile.await.unwrap();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    // Woken by the subscription until nothing is left to run.
    while apollo_tests::chaos::in_flight(&c).await > 0 {
        tokio::time::timeout(Duration::from_secs(60), events.recv()).await.expect("progress").unwrap();
    }
    let st: apollo_shared::protocol::AgentStatus = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
    assert_eq!(st.counts["SUCCESS"], 2000, "{:?}", st.counts);
    let run_secs = started.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut lat = probing.await.unwrap();
    lat.sort();
    let p99 = lat[lat.len() * 99 / 100];
    let max = *lat.last().unwrap();
    let peak = peak_rss_kib(pid);
    println!(
        "hostile: 500 idle connections + a deaf subscriber + {tried} bad requests during {} instances in {run_secs:.1}s; \
         agent peak RSS {:.1} MB (idle {:.1} MB); ordinary client p99 {:.1} ms, max {:.1} ms over {} calls",
        ids.len(),
        peak as f64 / 1024.0,
        rss_idle as f64 / 1024.0,
        p99.as_secs_f64() * 1000.0,
        max.as_secs_f64() * 1000.0,
        lat.len()
    );
    assert_eq!(ids.len(), 2000);
    assert!(peak < 256 * 1024, "agent peak RSS {peak} KiB");
    assert!(max < Duration::from_secs(2), "an ordinary call waited {max:?}");
    // The deaf subscriber held nothing up, and the agent still accepts.
    drop(deaf);
    drop(idle);
    agent.client().await.request::<m::AgentStatus>(NoParams {}).await.unwrap();
}
