package io.cotx.tm;

import com.arjuna.ats.arjuna.common.CoordinatorEnvironmentBean;
import com.arjuna.ats.arjuna.common.CoreEnvironmentBean;
import com.arjuna.ats.arjuna.common.ObjectStoreEnvironmentBean;
import com.arjuna.ats.arjuna.common.RecoveryEnvironmentBean;
import com.arjuna.ats.arjuna.recovery.RecoveryManager;
import com.arjuna.ats.arjuna.recovery.RecoveryModule;
import com.arjuna.ats.internal.jta.recovery.arjunacore.XARecoveryModule;
import com.arjuna.ats.jta.common.JTAEnvironmentBean;
import com.arjuna.ats.jta.recovery.XAResourceRecoveryHelper;
import com.arjuna.common.internal.util.propertyservice.BeanPopulator;
import jakarta.transaction.TransactionManager;
import java.nio.file.Path;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import javax.sql.XAConnection;
import javax.sql.XADataSource;
import javax.transaction.xa.XAResource;

/**
 * Standalone Narayana set up the way an application using pg_co / mysql_co must set it up
 * (docs/transaction-managers.md): a unique node identifier that recovery filters on, a
 * durable object store of its own, and a recovery manager that can reach every data source
 * (so a branch left prepared by a crash or a refused rollback is finished). Engine mode only:
 * {@link #startRecovery} refuses a data source where pg_co / mysql_co does not enforce.
 */
public final class Narayana {
    private static RecoveryManager recovery;

    private Narayana() {}

    /**
     * Must run before the first transaction (Narayana reads its beans once).
     *
     * @param nodeId   unique per TM instance, at most 28 bytes; it is written into every Xid
     *                 and recovery only touches Xids of the nodes in xaRecoveryNodes
     * @param storeDir the transaction log; must survive restarts (recovery reads it)
     * @param timeoutS transaction timeout (the reaper rolls back older transactions)
     */
    public static synchronized TransactionManager configure(String nodeId, Path storeDir, int timeoutS) {
        CoreEnvironmentBean core = BeanPopulator.getDefaultInstance(CoreEnvironmentBean.class);
        try {
            core.setNodeIdentifier(nodeId);
        } catch (Exception e) {
            throw new IllegalArgumentException("bad node identifier " + nodeId, e);
        }
        for (String name : new String[] {null, "communicationStore", "stateStore"}) {
            ObjectStoreEnvironmentBean os = name == null
                    ? BeanPopulator.getDefaultInstance(ObjectStoreEnvironmentBean.class)
                    : BeanPopulator.getNamedInstance(ObjectStoreEnvironmentBean.class, name);
            os.setObjectStoreDir(storeDir.toString());
        }
        CoordinatorEnvironmentBean coord = BeanPopulator.getDefaultInstance(CoordinatorEnvironmentBean.class);
        coord.setDefaultTimeout(timeoutS);
        // Heuristic outcomes stay in the log (default, kept explicit): an operator must see them.
        coord.setMaintainHeuristics(true);
        // Phase two runs in the committing thread: commit() returns after every branch is
        // committed, so the application's "committed" means committed (the default).
        coord.setAsyncCommit(false);
        coord.setAsyncRollback(false);
        JTAEnvironmentBean jta = BeanPopulator.getDefaultInstance(JTAEnvironmentBean.class);
        jta.setXaRecoveryNodes(List.of(nodeId));
        RecoveryEnvironmentBean rec = BeanPopulator.getDefaultInstance(RecoveryEnvironmentBean.class);
        rec.setRecoveryListener(false);     // no TCP listener (port 4712) in an embedded TM
        rec.setPeriodicRecoveryPeriod(10);  // seconds between passes (default 120)
        rec.setRecoveryBackoffPeriod(1);
        return com.arjuna.ats.jta.TransactionManager.transactionManager();
    }

    /**
     * Refuses data sources without engine-side enforcement (pg_co / mysql_co: {@link
     * EngineEnforcement#require}, naming the resource), then starts periodic recovery over
     * them (XA RECOVER / pg_prepared_xacts). Call it at start, before the first transaction.
     *
     * @param resources name (as the application calls the resource) -> data source
     * @throws EngineEnforcement.Missing a resource's engine does not enforce commitment ordering
     * @throws SQLException a data source could not be asked
     */
    public static synchronized RecoveryManager startRecovery(Map<String, XADataSource> resources) throws SQLException {
        EngineEnforcement.require(resources);
        return startRecoveryOver(resources);
    }

    /**
     * Benchmark only: starts recovery over the data sources <em>without</em> the check of
     * {@link #startRecovery}, so that plain XA (pg_co / mysql_co off) can be measured as
     * the baseline beside the engines' commitment ordering ({@link Load}, mode 2pc). Plain
     * 2PC is atomic, not serializable across the databases (the overdraft of
     * {@code OverdraftTest} happens); an application must call {@link #startRecovery}.
     */
    public static synchronized RecoveryManager startRecoveryPlainXa(Map<String, XADataSource> resources) {
        return startRecoveryOver(resources);
    }

    private static RecoveryManager startRecoveryOver(Map<String, XADataSource> resources) {
        if (recovery == null) {
            recovery = RecoveryManager.manager(RecoveryManager.INDIRECT_MANAGEMENT);
        }
        XARecoveryModule xrm = null;
        for (RecoveryModule m : recovery.getModules()) {
            if (m instanceof XARecoveryModule x) {
                xrm = x;
            }
        }
        if (xrm == null) {
            throw new IllegalStateException("Narayana has no XARecoveryModule (RecoveryEnvironmentBean.recoveryModuleClassNames)");
        }
        for (XADataSource ds : resources.values()) {
            xrm.addXAResourceRecoveryHelper(new Helper(ds));
        }
        return recovery;
    }

    public static synchronized void stopRecovery() {
        if (recovery != null) {
            recovery.terminate();
            recovery = null;
        }
    }

    /** Hands recovery one XAResource per data source, on a connection it keeps open. */
    static final class Helper implements XAResourceRecoveryHelper {
        private final XADataSource ds;
        private final List<XAConnection> open = new ArrayList<>();

        Helper(XADataSource ds) {
            this.ds = ds;
        }

        @Override
        public boolean initialise(String p) {
            return true;
        }

        @Override
        public synchronized XAResource[] getXAResources() {
            try {
                for (XAConnection c : open) {
                    try {
                        c.close();
                    } catch (SQLException ignored) {
                        // a dead connection; a new one follows
                    }
                }
                open.clear();
                XAConnection c = ds.getXAConnection();
                open.add(c);
                return new XAResource[] {c.getXAResource()};
            } catch (SQLException e) {
                // The database is down: recovery tries again at its next pass.
                return new XAResource[0];
            }
        }
    }
}
