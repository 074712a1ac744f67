//! The status page's HTML: a layout around each view's main part, rendered on the server.
//! Everything that comes from the state or a request (names, descriptions, metadata, process
//! ids, messages) passes through [`esc`]; the script (`page.js`) only swaps in main parts
//! rendered here.

use std::fmt::Write;

use super::view::{
    Cluster, HolderRow, LeaseRow, Listed, NamespacePage, Overview, SemaphoreBlock, WaiterRow,
};
use crate::state::Metadata;

/// `text` safe inside an element or a quoted attribute.
pub(super) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// What the layout needs besides the main part.
pub(super) struct Frame<'a> {
    pub node_id: u64,
    /// The page is served without TLS.
    pub plaintext: bool,
    /// Where the script fetches this page's main part.
    pub part: &'a str,
    pub title: &'a str,
}

/// A whole page: `main` inside the layout every page shares.
pub(super) fn page(frame: &Frame<'_>, main: &str) -> String {
    let warning = if frame.plaintext {
        "<p class=\"warn\" id=\"plaintext\">Served without TLS: this page, and any token entered \
         here, cross the network readable. Start conchd with --tls-cert to serve it over \
         HTTPS.</p>"
    } else {
        ""
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · conch node {node}</title>\
         <link rel=\"stylesheet\" href=\"/ui/assets/page.css\">\
         <script src=\"/ui/assets/page.js\" defer></script></head>\n<body>\
         <header><a class=\"home\" href=\"/ui/\">conch</a> <span>status of node {node}</span>\
         <span id=\"updated\" class=\"stamp\"></span>\
         <button id=\"forget\" type=\"button\" hidden>forget token</button></header>\n\
         {warning}<noscript><p class=\"warn\">Without JavaScript the page does not refresh \
         and cannot send a token.</p></noscript>\n\
         <main id=\"main\" data-part=\"{part}\">{main}</main>\n</body></html>\n",
        title = esc(frame.title),
        node = frame.node_id,
        part = esc(frame.part),
    )
}

/// The form that asks for a token (kept in the tab's sessionStorage by the script, sent as a
/// header, never in a URL), with why it is asked for.
pub(super) fn token_form(message: &str) -> String {
    format!(
        "<section class=\"token\"><h2>Token needed</h2><p class=\"bad\">{}</p>\
         <form id=\"token-form\" autocomplete=\"off\">\
         <label for=\"token\">Access token</label> \
         <input id=\"token\" name=\"token\" type=\"password\" size=\"40\" \
         placeholder=\"conch_…\" autocomplete=\"off\"> <button type=\"submit\">Show</button>\
         </form><p class=\"note\">Kept in this browser tab only (sessionStorage) and sent as an \
         Authorization header; the page shows the namespaces the token may read.</p></section>",
        esc(message)
    )
}

/// A refusal or failure in place of a view.
pub(super) fn problem(message: &str) -> String {
    format!(
        "<section class=\"problem\"><h2>Not shown</h2><p class=\"bad\">{}</p></section>",
        esc(message)
    )
}

/// A duration in milliseconds as a person reads it: `850ms`, `42s`, `3m 12s`, `2h 5m`, `3d 4h`.
pub(super) fn duration(ms: i64) -> String {
    let s = ms / 1_000;
    match s {
        _ if ms < 1_000 => format!("{}ms", ms.max(0)),
        0..60 => format!("{s}s"),
        60..3_600 => format!("{}m {}s", s / 60, s % 60),
        3_600..86_400 => format!("{}h {}m", s / 3_600, s % 3_600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3_600),
    }
}

fn more_note(out: &mut String, more: bool) {
    if more {
        out.push_str("<p class=\"note\">More exist than are shown here; list them with conch.</p>");
    }
}

/// Metadata other than the host and pid shown in their own columns.
fn other_metadata(metadata: &Metadata) -> String {
    let rest: Vec<String> = metadata
        .iter()
        .filter(|(k, _)| {
            k.as_str() != super::view::META_HOST && k.as_str() != super::view::META_PID
        })
        .map(|(k, v)| format!("<code>{}={}</code>", esc(k), esc(v)))
        .collect();
    rest.join(" ")
}

fn lease_cell(lease_id: &str) -> String {
    if lease_id.is_empty() {
        "<span class=\"dim\" title=\"another token's lease\">hidden</span>".into()
    } else {
        format!("<code>{}</code>", esc(lease_id))
    }
}

fn cluster_section(out: &mut String, c: &Cluster) {
    let leader = match (&c.leader_id, &c.leader_addr) {
        (Some(id), Some(addr)) => format!("node {id} at {}", esc(addr)),
        (Some(id), None) => format!("node {id}"),
        (None, _) => "<span class=\"bad\">none known</span>".into(),
    };
    let _ = write!(
        out,
        "<section id=\"cluster\"><h2>Cluster</h2><dl class=\"facts\">\
         <dt>This node</dt><dd>{id} at {addr} · <b>{role}</b></dd>\
         <dt>Leader</dt><dd>{leader}</dd><dt>Term</dt><dd>{term}</dd>\
         <dt>Log</dt><dd>last {last}, applied {applied}, snapshot {snap}</dd>\
         <dt>Leader changes</dt><dd>{changes} seen by this node since it started</dd>\
         <dt>Release</dt><dd>conch {release} · cluster version {version}{pending}</dd>",
        release = esc(&c.release),
        version = c.cluster_version,
        pending = if c.cluster_version < c.cluster_version_max {
            format!(
                " (this node speaks {}: an upgrade waits for <code>conch cluster finalize</code>)",
                c.cluster_version_max
            )
        } else {
            String::new()
        },
        id = c.node_id,
        addr = esc(&c.node_addr),
        role = esc(&c.role),
        term = c.term,
        last = c.last_log_index,
        applied = c.applied_index,
        snap = c.snapshot_index,
        changes = c.leader_changes,
    );
    match (&c.certificate_expires_at, c.certificate_expires_in_ms) {
        (Some(at), Some(ms)) => {
            let class = if ms < 14 * 86_400_000 { "bad" } else { "ok" };
            let _ = write!(
                out,
                "<dt>Certificate</dt><dd class=\"{class}\">expires {} (in {})</dd>",
                esc(at),
                duration(ms)
            );
        }
        _ if c.tls => out.push_str("<dt>Certificate</dt><dd>expiry unknown</dd>"),
        _ => out.push_str("<dt>TLS</dt><dd class=\"bad\">off</dd>"),
    }
    out.push_str("</dl>");
    for problem in &c.problems {
        let _ = write!(out, "<p class=\"warn\">{}</p>", esc(problem));
    }
    out.push_str(
        "<table class=\"members\"><thead><tr><th>Node</th><th>Address</th><th>Role</th>\
         <th>Matched index</th><th>Lag (entries)</th></tr></thead><tbody>",
    );
    for m in &c.members {
        let opt = |v: Option<u64>| {
            v.map_or_else(|| "<span class=\"dim\">—</span>".into(), |v| v.to_string())
        };
        let lag_class = match m.lag {
            Some(lag) if lag > 100 => " class=\"bad\"",
            _ => "",
        };
        let _ = write!(
            out,
            "<tr class=\"member {role}\"><td>{id}{this}</td><td>{addr}</td><td>{role}</td>\
             <td>{matched}</td><td{lag_class}>{lag}</td></tr>",
            id = m.id,
            this = if m.this_node { " (this page)" } else { "" },
            addr = esc(&m.addr),
            role = m.role,
            matched = opt(m.matched_index),
            lag = opt(m.lag),
        );
    }
    out.push_str("</tbody></table>");
    if !c.lag_known {
        out.push_str(
            "<p class=\"note\">Replication lag is tracked by the leader: open this page on the \
             leader to see it.</p>",
        );
    }
    out.push_str("</section>");
}

fn leases_table(out: &mut String, leases: &[LeaseRow], with_namespace: bool) {
    if leases.is_empty() {
        out.push_str("<p class=\"dim\">No leases.</p>");
        return;
    }
    out.push_str("<table class=\"leases\"><thead><tr>");
    if with_namespace {
        out.push_str("<th>Namespace</th>");
    }
    out.push_str(
        "<th>Lease</th><th>Kind</th><th>Process</th><th>Host</th><th>PID</th><th>TTL</th>\
         <th>Expires in</th></tr></thead><tbody>",
    );
    for l in leases {
        out.push_str("<tr class=\"lease\">");
        if with_namespace {
            let _ = write!(
                out,
                "<td><a href=\"/ui/ns/{0}\">{0}</a></td>",
                esc(&l.namespace)
            );
        }
        let class = if l.expires_in_ms < 5_000 {
            " class=\"bad\""
        } else {
            ""
        };
        let _ = write!(
            out,
            "<td>{lease}</td><td>{kind}</td><td>{process}</td><td>{host}</td><td>{pid}</td>\
             <td>{ttl}s</td><td{class} title=\"{at}\">{left}</td></tr>",
            lease = lease_cell(&l.lease_id),
            kind = l.kind,
            process = esc(&l.process_id),
            host = esc(&l.host),
            pid = esc(&l.pid),
            ttl = l.ttl_s,
            at = esc(&l.expires_at),
            left = duration(l.expires_in_ms),
        );
    }
    out.push_str("</tbody></table>");
}

/// The overview's main part.
pub(super) fn overview(o: &Overview) -> String {
    let mut out = String::new();
    cluster_section(&mut out, &o.cluster);
    let _ = write!(
        out,
        "<section id=\"namespaces\"><h2>Namespaces</h2><p class=\"note\">Access control is \
         {}. Read at {}.</p>",
        if o.access_control {
            "on: only the namespaces this token may read are listed"
        } else {
            "off: every namespace is listed"
        },
        esc(&o.read_at)
    );
    if o.namespaces.items.is_empty() {
        out.push_str("<p class=\"dim\">No namespaces to show.</p>");
    } else {
        out.push_str(
            "<table class=\"namespaces\"><thead><tr><th>Namespace</th><th>Semaphores</th>\
             <th>Holders</th><th>Waiters</th><th>Locks held</th><th>Wait groups</th>\
             <th>Barriers</th><th>Leases</th><th>Description</th></tr></thead><tbody>",
        );
        for n in &o.namespaces.items {
            let plus = if n.more { "+" } else { "" };
            let _ = write!(
                out,
                "<tr class=\"namespace\"><td><a href=\"/ui/ns/{name}\">{name}</a></td>\
                 <td>{}{plus}</td><td>{}{plus}</td><td>{}{plus}</td><td>{}{plus}</td>\
                 <td>{}{plus}</td><td>{}{plus}</td><td>{}{plus}</td><td>{desc}</td></tr>",
                n.semaphores,
                n.holders,
                n.waiters,
                n.locks_held,
                n.wait_groups,
                n.barriers,
                n.leases,
                name = esc(&n.name),
                desc = esc(&n.description),
            );
        }
        out.push_str("</tbody></table>");
    }
    more_note(&mut out, o.namespaces.more);
    out.push_str("</section><section id=\"expiring\"><h2>Leases expiring soonest</h2>");
    leases_table(&mut out, &o.expiring_leases, true);
    out.push_str("</section>");
    out
}

fn holders_table(out: &mut String, holders: &Listed<HolderRow>, lock: bool) {
    if holders.items.is_empty() {
        out.push_str("<p class=\"dim\">Nobody holds it.</p>");
        return;
    }
    let weight = if lock { "Mode" } else { "Weight" };
    let _ = write!(
        out,
        "<table class=\"holders\"><thead><tr><th>Fencing token</th><th>Lease</th>\
         <th>{weight}</th><th>Process</th><th>Host</th><th>PID</th><th>Held for</th>\
         <th>Metadata</th></tr></thead><tbody>"
    );
    for h in &holders.items {
        let weight = match h.exclusive {
            Some(true) => "exclusive".to_string(),
            Some(false) => "shared".to_string(),
            None => h.weight.to_string(),
        };
        let _ = write!(
            out,
            "<tr class=\"holder\"><td>{token}</td><td>{lease}</td><td>{weight}</td>\
             <td>{process}</td><td class=\"host\">{host}</td><td class=\"pid\">{pid}</td>\
             <td title=\"since {at}\">{held}</td><td>{meta}</td></tr>",
            token = h.fencing_token,
            lease = lease_cell(&h.lease_id),
            process = esc(&h.process_id),
            host = esc(&h.host),
            pid = esc(&h.pid),
            at = esc(&h.locked_at),
            held = match h.hold_ends_in_ms {
                Some(ms) => format!(
                    "{} <span class=\"dim\">(hold limit: ends in {})</span>",
                    duration(h.held_for_ms),
                    duration(ms)
                ),
                None => duration(h.held_for_ms),
            },
            meta = other_metadata(&h.metadata),
        );
    }
    out.push_str("</tbody></table>");
    more_note(out, holders.more);
}

fn queue_table(out: &mut String, queue: &Listed<WaiterRow>, lock: bool) {
    if queue.items.is_empty() {
        out.push_str("<p class=\"dim\">Nobody waits.</p>");
        return;
    }
    let first = if lock {
        "<th>Lock</th><th>Mode</th>"
    } else {
        "<th>Weight</th>"
    };
    let _ = write!(
        out,
        "<table class=\"queue\"><thead><tr><th>Position</th>{first}<th>Lease</th>\
         <th>Process</th><th>Host</th><th>PID</th><th>Waited for</th><th>Times out in</th>\
         <th>Metadata</th></tr></thead><tbody>"
    );
    for w in &queue.items {
        let what = match (&w.path, w.exclusive) {
            (Some(path), exclusive) => format!(
                "<td><code>{}</code></td><td>{}</td>",
                esc(path),
                if exclusive == Some(true) {
                    "exclusive"
                } else {
                    "shared"
                }
            ),
            (None, _) => format!("<td>{}</td>", w.weight),
        };
        let timeout = w
            .timeout_in_ms
            .map_or_else(|| "never".to_string(), duration);
        let _ = write!(
            out,
            "<tr class=\"waiter\"><td>{pos}</td>{what}<td>{lease}</td><td>{process}</td>\
             <td class=\"host\">{host}</td><td class=\"pid\">{pid}</td>\
             <td title=\"since {at}\">{waited}</td><td>{timeout}</td><td>{meta}</td></tr>",
            pos = w.position + 1,
            lease = lease_cell(&w.lease_id),
            process = esc(&w.process_id),
            host = esc(&w.host),
            pid = esc(&w.pid),
            at = esc(&w.queued_at),
            waited = duration(w.waited_for_ms),
            meta = other_metadata(&w.metadata),
        );
    }
    out.push_str("</tbody></table>");
    more_note(out, queue.more);
}

fn semaphore_block(out: &mut String, s: &SemaphoreBlock) {
    let full = if s.holds >= s.permits { " full" } else { "" };
    let _ = write!(
        out,
        "<article class=\"semaphore{full}\" id=\"sem-{name}\"><h3>{name} \
         <span class=\"gauge\">{holds}/{permits} permits held</span></h3>\
         <p class=\"note\">{holders} holder(s), {waiters} waiting · version {version}{desc}</p>",
        name = esc(&s.name),
        holds = s.holds,
        permits = s.permits,
        holders = s.holders_count,
        waiters = s.waiters_count,
        version = s.version,
        desc = if s.description.is_empty() {
            String::new()
        } else {
            format!(" · {}", esc(&s.description))
        },
    );
    out.push_str("<h4>Holders</h4>");
    holders_table(out, &s.holders, false);
    out.push_str("<h4>Wait queue</h4>");
    queue_table(out, &s.queue, false);
    out.push_str("</article>");
}

/// A namespace's main part.
pub(super) fn namespace(n: &NamespacePage) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<nav><a href=\"/ui/\">all namespaces</a></nav><h2>Namespace {name}</h2>\
         <p class=\"note\">{desc}{meta} Read at {at}.</p>",
        name = esc(&n.name),
        desc = esc(&n.description),
        meta = {
            let m: Vec<String> = n
                .metadata
                .iter()
                .map(|(k, v)| format!("<code>{}={}</code>", esc(k), esc(v)))
                .collect();
            m.join(" ")
        },
        at = esc(&n.read_at),
    );
    out.push_str("<section id=\"semaphores\"><h2>Semaphores</h2>");
    if n.semaphores.items.is_empty() {
        out.push_str("<p class=\"dim\">No semaphores.</p>");
    }
    for s in &n.semaphores.items {
        semaphore_block(&mut out, s);
    }
    more_note(&mut out, n.semaphores.more);
    out.push_str("</section><section id=\"locks\"><h2>Locks held</h2>");
    if n.locks.items.is_empty() {
        out.push_str("<p class=\"dim\">No lock is held.</p>");
    }
    for l in &n.locks.items {
        let _ = write!(
            out,
            "<article class=\"lock\"><h3><code>{path}</code> <span class=\"gauge\">{mode}, \
             {waiters} waiting</span></h3>",
            path = esc(&l.path),
            mode = l.mode,
            waiters = l.waiters,
        );
        holders_table(
            &mut out,
            &Listed {
                items: l.holders.clone(),
                more: false,
            },
            true,
        );
        out.push_str("</article>");
    }
    more_note(&mut out, n.locks.more);
    out.push_str("<h3>Lock wait queue</h3>");
    queue_table(&mut out, &n.lock_queue, true);
    out.push_str("</section><section id=\"wait-groups\"><h2>Wait groups</h2>");
    if n.wait_groups.items.is_empty() {
        out.push_str("<p class=\"dim\">No wait groups.</p>");
    } else {
        out.push_str(
            "<table><thead><tr><th>Name</th><th>Counter</th><th>Completed jobs</th>\
             <th>Status</th><th>Expires</th></tr></thead><tbody>",
        );
        for g in &n.wait_groups.items {
            let _ = write!(
                out,
                "<tr class=\"wait-group\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td></tr>",
                esc(&g.name),
                g.counter,
                g.completed_jobs,
                g.status,
                esc(g.expires_at.as_deref().unwrap_or("never")),
            );
        }
        out.push_str("</tbody></table>");
    }
    more_note(&mut out, n.wait_groups.more);
    out.push_str("</section><section id=\"barriers\"><h2>Barriers</h2>");
    if n.barriers.items.is_empty() {
        out.push_str("<p class=\"dim\">No barriers.</p>");
    } else {
        out.push_str(
            "<table><thead><tr><th>Name</th><th>Arrived</th><th>Generation</th></tr></thead>\
             <tbody>",
        );
        for b in &n.barriers.items {
            let _ = write!(
                out,
                "<tr class=\"barrier\"><td>{}</td><td>{} of {}</td><td>{}</td></tr>",
                esc(&b.name),
                b.arrived,
                b.expected,
                b.generation
            );
        }
        out.push_str("</tbody></table>");
    }
    more_note(&mut out, n.barriers.more);
    out.push_str("</section><section id=\"leases\"><h2>Leases</h2>");
    leases_table(&mut out, &n.leases.items, false);
    more_note(&mut out, n.leases.more);
    out.push_str("</section>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_covers_markup_and_both_quotes() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
        assert_eq!(esc("plain-name_1.2"), "plain-name_1.2");
    }

    #[test]
    fn durations_read_as_a_person_says_them() {
        assert_eq!(duration(-5), "0ms");
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(42_000), "42s");
        assert_eq!(duration(192_000), "3m 12s");
        assert_eq!(duration(7_500_000), "2h 5m");
        assert_eq!(duration(273_600_000), "3d 4h");
    }

    #[test]
    fn every_page_says_when_it_is_served_without_tls() {
        let frame = |plaintext| Frame {
            node_id: 2,
            plaintext,
            part: "/ui/part/",
            title: "<b>",
        };
        let plain = page(&frame(true), "x");
        assert!(plain.contains("id=\"plaintext\""), "{plain}");
        assert!(plain.contains("<title>&lt;b&gt; · conch node 2</title>"));
        assert!(!page(&frame(false), "x").contains("id=\"plaintext\""));
    }
}
