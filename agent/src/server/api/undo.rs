//! tasks.rollback: a FAILED instance's, or a SUCCESS one's when every step can be undone.

use super::*;

impl Api {
    pub(super) async fn rollback(&self, p: IdParams, actor: &str) -> Result<Instance, RpcError> {
        let lease = self.h.config().scheduler.lease;
        let given = p.reason.as_deref().map(str::trim).filter(|r| !r.is_empty());
        let inst = self.h.store.get(&p.id).await.map_err(store_err)?;
        if inst.state == apollo_shared::state::TaskState::Success {
            self.undoable(&inst, given).await?;
        }
        let reason = given.unwrap_or("no reason given");
        self.h.store.manual_rollback(&p.id, lease, reason, actor).await.map_err(store_err)?;
        let inst = self.h.store.get(&p.id).await.map_err(store_err)?;
        self.h.control.adopt(inst, None);
        self.h.store.get(&p.id).await.map_err(store_err)
    }

    /// Whether SUCCESS instance `inst` may be rolled back: with a reason,
    /// and only when every step's plugin can undo what it did (a shell
    /// step without `rollback_command` cannot); the refusal names them all.
    pub(super) async fn undoable(&self, inst: &Instance, reason: Option<&str>) -> Result<(), RpcError> {
        let refuse = |msg: String| Err(RpcError::new(code::INVALID_PARAMS, msg));
        if reason.is_none() {
            return refuse(format!(
                "instance {} succeeded: undoing it needs a reason (--reason TEXT), which goes to its history",
                inst.id
            ));
        }
        let current = self
            .h
            .catalog
            .read()
            .expect("catalog")
            .defs
            .values()
            .find(|l| l.hash == inst.def_hash)
            .map(|l| l.def.clone());
        let def = match current {
            Some(d) => d,
            None => {
                let (file, source) = self.h.store.def_source(&inst.def_hash).await.map_err(store_err)?;
                let parsed = apollo_shared::def::parse(&source, &file);
                std::sync::Arc::new(parsed.map_err(|e| RpcError::new(code::INTERNAL, e.to_string()))?)
            }
        };
        let view = self.h.plugins.view(inst.pins.as_ref());
        let mut cannot = Vec::new();
        for st in inst.steps.iter().flatten().filter(|st| st.state == apollo_shared::state::StepState::Success) {
            // A fan-out step's params are its items'; the step's as written say what they undo.
            let params = match def.steps.get(st.seq as usize).filter(|d| d.foreach.is_some()) {
                Some(d) => d.params.clone(),
                None => st.params.as_ref().and_then(Value::as_object).cloned().unwrap_or_default(),
            };
            let why = match crate::steps::registration(&view, &def, st.seq) {
                Ok(reg) => reg.plugin.cannot_undo(&params),
                Err(e) => Some(e.message),
            };
            if let Some(why) = why {
                cannot.push(format!("{} (#{}, {}: {why})", st.name, st.seq, st.plugin));
            }
        }
        match cannot.is_empty() {
            true => Ok(()),
            false => Err(RpcError::new(
                code::VALIDATION_FAILED,
                format!(
                    "instance {} cannot be undone: {} cannot be rolled back; nothing was changed",
                    inst.id,
                    cannot.join(", ")
                ),
            )),
        }
    }
}
